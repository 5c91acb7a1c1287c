"""Names the code no longer has stay out of it and its docs: the move under blobstore_server/ left `--help` texts,
docstrings and README lines naming modules that were gone."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STALE = ("python -m services.", "blobstore.nemesis", "DiskStore", "blobstore_server.admin", "blobstore_server/admin")


def test_no_file_names_a_module_or_class_that_is_gone() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = [f"{name}:{number}: {stale}"
             for name in tracked if name.endswith((".py", ".md", ".toml", ".json", ".sh"))
             and not name.endswith("test_stale_names.py")
             for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
             for stale in STALE if stale in line]
    assert found == []
