"""Disks of a fixed size: an ext4 image per disk, loop-mounted where a test's blobnode keeps it (root only; `make
setup` installs e2fsprogs and mount). Unmounted and detached by the context's exit, also when the test failed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@contextmanager
def loop_disks(points: Sequence[Path], size: int) -> Iterator[None]:
    """A fresh ext4 filesystem of `size` bytes (no blocks reserved for root) mounted at each of `points`; the image
    files lie beside them. Leave the mounts only once every process using them has stopped."""
    devices: list[str] = []
    mounted: list[Path] = []
    try:
        for point in points:
            point.mkdir(parents=True, exist_ok=True)
            image = point.with_name(f"{point.name}.ext4")
            with open(image, "wb") as f:
                f.truncate(size)
            _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
            devices.append(_run("losetup", "--find", "--show", str(image)))
            _run("mount", devices[-1], str(point))
            mounted.append(point)
        yield
    finally:
        for point in reversed(mounted):
            if subprocess.run(["umount", str(point)], check=False).returncode:
                subprocess.run(["umount", "--lazy", str(point)], check=False)  # a straggler holds it: detach anyway
        for device in reversed(devices):
            subprocess.run(["losetup", "--detach", device], check=False)
