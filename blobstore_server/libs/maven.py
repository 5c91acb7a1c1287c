"""Jars from Maven Central, copied once into a cache outside git (Kafka's broker, Spark's Kafka source).

A fresh clone fetches them on first use; later calls return at once. Needs `mvn` once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """`$BLOBSTORE_CACHE`, else `$XDG_CACHE_HOME/blobstore`, else `~/.cache/blobstore`."""
    if env := os.environ.get("BLOBSTORE_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blobstore"


def fetch_jars(pom: Path, dest: Path, expect: str) -> Path:
    """Copy the runtime dependencies of `pom` into `dest` once; `expect` is a glob one of them must match.

    A lock serialises concurrent first runs, and the jars appear under their final name only when Maven
    finished, so a killed fetch never leaves a half-filled folder that looks complete.
    """
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return dest
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"Maven (mvn) is needed once to fetch the jars of {pom}: apt-get install maven")
        staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
        try:
            result = subprocess.run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                                     "-DincludeScope=runtime", f"-DoutputDirectory={staging}"],
                                    capture_output=True, text=True)
            if result.returncode != 0 or not any(staging.glob(expect)):
                tail = f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
                raise RuntimeError(f"fetching the jars of {pom} failed:\n{tail}")
            staging.rename(dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return dest
