"""A real blobnode's background reader (services/blobnode/reader_app.py): background reads are served by a process
at SCHED_IDLE, forked by the blobnode's fork server once the first one arrived, within the disk's background rate;
it is replaced when it dies (reads meanwhile go to the blobnode) and dies with its blobnode, even on SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from blobstore_server.cluster.procs import poll
from blobstore_server.libs import cpugroup
from blobstore_server.libs.proto.blobnode import IOClass
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.blobnode.reader_process import RESTART_AFTER
from tests.support.processes import BlobnodeFactory, wait_until


def _idle_groups() -> Path | None:
    """Where a blobnode's readers run in an idle cpu cgroup, if this box lets them (as root with cgroupfs, as in CI)."""
    group = cpugroup.idle_group_beside()
    return group if group is not None and os.access(group.parent, os.W_OK) else None


IDLE_GROUPS = _idle_groups()

MiB = 1 << 20
RATE_MIB = 8


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def readers_of(blobnode: int) -> list[int]:
    """The blobnode's readers: the children of its one child, the fork server."""
    return [reader for forks in children(blobnode) for reader in children(forks)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def states(pids: list[int]) -> dict[int, str]:
    """Each live one of `pids`: its state, parent and kernel wait channel, for a failure message."""
    found = {}
    for pid in filter(alive, pids):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
            found[pid] = f"state {stat[0]}, parent {stat[1]}, wchan {Path(f'/proc/{pid}/wchan').read_text()}"
    return found


def test_background_reads_go_to_an_idle_priority_reader_that_lives_and_dies_with_its_blobnode(
        blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory(disks=1, background_mb_per_sec=RATE_MIB)
    vuid = Vuid.make(1, 0, 1)
    shards = {bid: os.urandom(MiB) for bid in range(1, 7)}
    readers: list[int] = []

    async def scenario() -> None:
        async with BlobnodeClient() as client:
            client.readers.recheck = 0.1
            await client.create_chunk(bn.url, 1, vuid)
            for bid, data in shards.items():
                await client.put_shard(bn.url, 1, vuid, bid, data)
            assert (await client.stat(bn.url)).background_host == ""  # none until a background read wants one

            async def background(bid: int, timeout: float = 10.0) -> bytes:
                return bytes(await client.get_shard(bn.url, 1, vuid, bid, io_class=IOClass.BACKGROUND,
                                                    timeout=timeout))

            assert await background(1) == shards[1]  # served by the blobnode; starts the reader
            deadline = time.monotonic() + 30
            while not await client.readers.of(bn.url):
                assert time.monotonic() < deadline, "the reader never came up"
                await asyncio.sleep(0.1)
            [forks] = children(bn.pid)
            readers.append(forks)
            [reader] = readers_of(bn.pid)
            readers.append(reader)
            assert os.sched_getscheduler(forks) != os.SCHED_IDLE  # the fork server is not a reader
            assert os.sched_getscheduler(reader) == os.SCHED_IDLE
            assert os.getsid(reader) == reader  # a session of its own: with autogroups, a CPU share of its own
            if Path("/proc/self/autogroup").exists():
                assert Path(f"/proc/{reader}/autogroup").read_text().split()[-1] == "19"
            assert not cpugroup.idle_group_of(forks)
            if IDLE_GROUPS:  # any other task preempts it at once
                assert cpugroup.idle_group_of(reader)

            # the reader serves background reads on its own: they flow with the blobnode stopped, user reads do not
            os.kill(bn.pid, signal.SIGSTOP)
            try:
                began = time.monotonic()
                for bid, data in shards.items():
                    assert await background(bid) == data
                # within the disk's background rate: 6 MiB at 8 MiB/s, less its quarter-second burst
                assert time.monotonic() - began >= (len(shards) - RATE_MIB / 4 - 1) / RATE_MIB
                with pytest.raises(Unavailable):
                    await client.get_shard(bn.url, 1, vuid, 1, timeout=1.0)
            finally:
                os.kill(bn.pid, signal.SIGCONT)

            # a dead reader: reads go to the blobnode, which starts another
            os.kill(reader, signal.SIGKILL)
            assert await background(2) == shards[2]
            wait_until(lambda: bool(readers_of(bn.pid)) and readers_of(bn.pid) != [reader], 30, "a new reader")
            [replacement] = readers_of(bn.pid)
            readers.append(replacement)
            deadline = time.monotonic() + 30
            while not await client.readers.of(bn.url):
                assert time.monotonic() < deadline, "no reader after the first died"
                await asyncio.sleep(0.1)
            assert await background(3) == shards[3]

    try:
        asyncio.run(scenario())
        os.kill(bn.pid, signal.SIGKILL)  # the blobnode killed outright: its reader goes with it
        wait_until(lambda: not any(alive(pid) for pid in readers), 10, "its fork server and reader to die with it")
    finally:
        for pid in readers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if IDLE_GROUPS:  # nobody was left to remove it
            cpugroup.remove_idle_group(IDLE_GROUPS)


def test_without_its_fork_server_a_blobnode_serves_background_reads_itself(blobnode_factory: BlobnodeFactory) -> None:
    bn = blobnode_factory(disks=1)
    vuid = Vuid.make(1, 0, 1)
    data = os.urandom(MiB)
    started: list[int] = []

    async def scenario() -> None:
        async with BlobnodeClient() as client:
            client.readers.recheck = 0.1
            await client.create_chunk(bn.url, 1, vuid)
            await client.put_shard(bn.url, 1, vuid, 1, data)

            async def background() -> bytes:
                return bytes(await client.get_shard(bn.url, 1, vuid, 1, io_class=IOClass.BACKGROUND, timeout=10))

            assert await background() == data
            wait_until(lambda: bool(readers_of(bn.pid)), 30, "a reader")
            [forks] = children(bn.pid)
            started.extend([forks, *readers_of(bn.pid)])
            os.kill(forks, signal.SIGKILL)  # its reader goes with it, and no other can be forked
            # A reader in an idle cpu cgroup dies once it gets a CPU: a loaded box may take seconds (CI, once: > 10).
            if not poll(lambda: not any(alive(pid) for pid in started), 30, 0.02):
                raise AssertionError(f"alive 30 s after the fork server's SIGKILL: {states(started)}")
            for _ in range(5):
                assert await background() == data
                await asyncio.sleep(RESTART_AFTER)
            assert (await client.stat(bn.url)).background_host == ""
            assert alive(bn.pid)

    try:
        asyncio.run(scenario())
        bn.stop()  # a blobnode that stops removes the idle group its readers ran in (once nothing else does)
        assert IDLE_GROUPS is None or not IDLE_GROUPS.exists()
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
