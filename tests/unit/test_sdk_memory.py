"""blobstore.memory through the SDK's clients: buffers freed and made again are not page-faulted in each time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from blobstore.memory import keep_freed_memory

# A client is made, then 20 rounds receive-like: 64 buffers of 256 KiB (16 MiB) made and freed; the page faults of
# those rounds are printed. Each variant runs in a process of its own: the setting is process-wide.
ROUNDS = """
import resource, sys
from blobstore import AsyncClient

AsyncClient("http://127.0.0.1:1", keep_freed_memory=sys.argv[1] == "keep")
held = [bytes(256 << 10) for _ in range(64)]
del held
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    held = [bytes(256 << 10) for _ in range(64)]
    del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(setting: str) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, setting], capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not keep_freed_memory(), reason="glibc's malloc only")
def test_a_client_keeps_freed_buffers_for_reuse_unless_told_not_to() -> None:
    kept, default = page_faults("keep"), page_faults("leave")
    assert default > 20 * 2048  # glibc gave the 16 MiB back each round: at least half its pages faulted in again
    assert kept * 5 < default  # seen: ~1,900 against ~42,000
