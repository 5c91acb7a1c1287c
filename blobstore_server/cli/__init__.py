"""The operators' side: the `blobstore` CLI, the cluster plan and launcher, the deploy bundles."""

from __future__ import annotations

import sys


def main() -> None:
    """The `blobstore` command. It is installed with the SDK too, so without the server extra it says what is missing
    instead of a traceback."""
    try:
        from blobstore_server.admin.cli import main as cli_main
    except ModuleNotFoundError as missing:
        sys.exit(f"blobstore: the CLI needs the server extra (missing module {missing.name!r}): "
                 "pip install 'blobstore[server]'")
    cli_main()
