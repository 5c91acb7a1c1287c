"""The operators' `blobstore` command: run a local cluster; put, get, stat and delete objects; look at shards, disks,
volumes, config and the queues; drive repair tasks; run the Spark inspections; model durability; derive keys and
service configs; write per-host deploy bundles. It uses the cluster package and the services' clients; the cluster
package never imports it."""

from __future__ import annotations

import sys


def main() -> None:
    """The `blobstore` command. It is installed with the SDK too, so without the server extra it says what is missing
    instead of a traceback."""
    try:
        from blobstore_server.cli.cli import main as cli_main
    except ModuleNotFoundError as missing:
        sys.exit(f"blobstore: the CLI needs the server extra (missing module {missing.name!r}): "
                 "pip install 'blobstore[server]'")
    cli_main()
