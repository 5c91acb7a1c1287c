"""The distributions as a user installs them: the wheel built from this checkout, installed into fresh venvs
outside it. `blobstore[server]` runs a whole cluster with `blobstore cluster up`, with no checkout and no
PYTHONPATH; `blobstore` alone is the SDK: only httpx (on aiohttp) and pydantic come along, and it stores and reads
through that cluster. The cluster is stopped by `cluster down` and, whatever happened, by PID from its cluster.json."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobstore_server.cluster.launcher import STATE_FILE, down
from tests.support.processes import REPO

# What `pip install blobstore` (no extras) must not bring: the server stack and the Spark jobs.
SERVER_STACK = {"pyspark", "fastapi", "uvicorn", "rocksdict", "confluent-kafka", "kafka-python", "numpy", "pyarrow",
                "redis", "typer"}
SDK_ALONE = """
import sys
from blobstore import Client
with Client(sys.argv[1:]) as client:
    location = client.put(b"lean" * 1000)
    assert client.get(location, offset=4, size=4) == b"lean"
    assert client.stat(location).size == 4000
    client.delete(location)
    large = bytes(range(256)) * (24 << 12)  # 6 MiB: read from the blobnodes through a read plan
    assert client.get(client.put(large)) == large
print(sorted(m for m in sys.modules if m.split(".")[0] in ("blobstore_server", "fastapi", "numpy", "pyspark")))
"""
# Outside the checkout and without its PYTHONPATH: only what the venv installed can be imported.
run = functools.partial(subprocess.run, check=True, capture_output=True, text=True, timeout=300,
                        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # built from a copy: an in-tree build would leave build/ and *.egg-info behind
    for part in ("blobstore", "blobstore_server"):
        shutil.copytree(REPO / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(root / "dist"), str(source)],
        cwd=root)
    return next((root / "dist").glob("blobstore-*.whl"))


def _venv(root: Path, requirement: str) -> Path:
    """A fresh venv under `root` with `requirement` installed; its bin/ folder."""
    run([sys.executable, "-m", "venv", str(root / "venv")], cwd=root)
    run([root / "venv" / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", requirement], cwd=root)
    return root / "venv" / "bin"


@pytest.fixture(scope="module")
def server(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[str]]]:
    """`blobstore[server]` in its own venv and the cluster its `cluster up` started: (bin, run dir, access URLs)."""
    root = tmp_path_factory.mktemp("server")
    bin_dir = _venv(root, f"{wheel}[server]")
    cluster = root / "run"
    try:
        up = run([bin_dir / "blobstore", "cluster", "up", "--dir", str(cluster), "--blobnodes", "6",
                  "--disks-per-node", "1"], cwd=root)
        yield bin_dir, cluster, [line for line in up.stdout.splitlines() if line.startswith("http")]
    finally:
        subprocess.run([bin_dir / "blobstore", "cluster", "down", "--dir", str(cluster)], capture_output=True,
                       timeout=120)
        if (cluster / STATE_FILE).exists():
            down(cluster)


def test_the_server_extra_runs_a_cluster_from_the_wheel_alone(server: tuple[Path, Path, list[str]]) -> None:
    bin_dir, cluster, access_urls = server
    assert len(access_urls) == 2
    processes = json.loads((cluster / STATE_FILE).read_text())["processes"]
    ours = [p for p in processes if p["name"] not in ("redis", "kafka")]
    assert ours and all(Path(p["command"][0]).parent == bin_dir for p in ours), [p["command"][:1] for p in ours]
    where = run([bin_dir / "python", "-c", "import blobstore_server; print(blobstore_server.__file__)"],
                cwd=cluster).stdout
    assert str(bin_dir.parent) in where and str(REPO) not in where  # the installed copy, not this checkout
    data = os.urandom(300_000)
    (cluster / "obj.bin").write_bytes(data)
    location = run([bin_dir / "blobstore", "put", "obj.bin", "--dir", str(cluster)], cwd=cluster).stdout.strip()
    run([bin_dir / "blobstore", "get", location, "-o", "back.bin", "--dir", str(cluster)], cwd=cluster)
    assert (cluster / "back.bin").read_bytes() == data


def test_the_sdk_installs_alone_and_talks_to_the_cluster(wheel: Path, server: tuple[Path, Path, list[str]],
                                                         tmp_path: Path) -> None:
    """Installed without extras: only the SDK's own dependencies come along, the SDK stores and reads back
    through it, and the `blobstore` command says which extra it needs instead of a traceback."""
    bin_dir = _venv(tmp_path, str(wheel))
    listed = run([bin_dir / "pip", "list", "--format=json"], cwd=tmp_path).stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert "blobstore" in installed
    assert not installed & SERVER_STACK, f"the SDK alone installed {installed & SERVER_STACK}"
    loaded = run([bin_dir / "python", "-c", SDK_ALONE, *server[2]], cwd=tmp_path).stdout
    assert loaded.strip() == "[]", f"the SDK imported server modules: {loaded}"
    cli = subprocess.run([bin_dir / "blobstore", "--help"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1
    assert "pip install 'blobstore[server]'" in cli.stderr
