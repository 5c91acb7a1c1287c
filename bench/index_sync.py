"""What the synced index write costs a blobnode's group commit (issue 29, item 3).

A blobnode makes a group of shard puts durable with one fdatasync per chunk file touched and one synced RocksDB
batch (the index: WAL write + WAL sync). This drives the real commit path (`ChunkFile.stage_put` then
`GroupCommit.stored`) from `--threads` threads, 10 KiB shards into one chunk on this machine's disk, in three
variants, alternated round by round so the noise of the box hits each alike:

    both      chunk bytes and index synced: what ran until the watermark (libs/chunkfile/chunk.py)
    data      chunk bytes synced, index not: what runs (plus a WAL sync a second)
    neither   nothing synced: the CPU floor of the path

and reports, per variant, puts/s, CPU per put (all threads of this process) and the wall time per commit group
(groups counted by the chunk's fdatasyncs), with the index's share of a synced group: (both - data) / both.
Writes JSON and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from blobstore_server.libs.chunkfile import ChunkFile, GroupCommit, required_column_families
from blobstore_server.libs.kv import Batch, KVStore
from blobstore_server.libs.proto.ids import ChunkId, Vuid

VARIANTS = {"both": (True, True), "data": (True, False), "neither": (False, False)}  # (chunk sync, index sync)


class SyncedIndex(KVStore):
    """Every index batch synced, as the group commit wrote them before the watermark."""

    def write(self, batch: Batch, *, sync: bool = True) -> None:
        super().write(batch, sync=True)


def one_round(root: Path, data_sync: bool, index_sync: bool, puts: int, threads: int, size: int) -> dict[str, float]:
    """`puts` shards of `size` bytes from `threads` threads into a fresh chunk; puts/s, groups, ms per group."""
    store = SyncedIndex if index_sync else KVStore
    kv = store(root / "index", required_column_families(), sync=data_sync)
    groups = [0]

    def counted(_seconds: float) -> None:
        groups[0] += 1

    vuid = int(Vuid.make(1, 0, 1))
    chunk = ChunkFile.create(root / "chunk", kv, ChunkId.new(vuid), sync=data_sync, commits=GroupCommit(kv),
                             on_sync=counted)
    payload = bytes(size)
    bids = iter(range(1, puts + 1))
    lock = threading.Lock()

    def writer() -> None:
        while True:
            with lock:
                bid = next(bids, None)
            if bid is None:
                return
            chunk.commits.stored(chunk.stage_put(bid, vuid, payload))

    workers = [threading.Thread(target=writer) for _ in range(threads)]
    cpu = time.process_time()
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    chunk.close()
    kv.close()
    made = groups[0] if data_sync else 0
    return {"puts_per_s": puts / elapsed, "cpu_us_per_put": cpu * 1e6 / puts, "groups": made,
            "ms_per_group": elapsed * 1e3 / made if made else 0.0, "puts_per_group": puts / made if made else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--puts", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--size", type=int, default=10 << 10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where the chunk and index go (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "index_sync.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (data_sync, index_sync) in VARIANTS.items():
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                runs[name].append(one_round(Path(root), data_sync, index_sync, args.puts, args.threads, args.size))
    median = {name: {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}
              for name, rounds in runs.items()}
    share = 1 - median["data"]["ms_per_group"] / median["both"]["ms_per_group"]
    result = {"puts": args.puts, "threads": args.threads, "size": args.size, "rounds": args.rounds,
              "median": median, "index_share_of_a_synced_group": round(share, 3), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    both, data, neither = (median[name] for name in VARIANTS)
    print(f"index sync ({args.size >> 10} KiB, {args.threads} threads, median of {args.rounds}): both synced "
          f"{both['puts_per_s']:.0f} puts/s, {both['cpu_us_per_put']:.0f} us CPU/put, "
          f"{both['ms_per_group']:.2f} ms/group ({both['puts_per_group']:.1f} puts); "
          f"data only {data['puts_per_s']:.0f} puts/s, "
          f"{data['cpu_us_per_put']:.0f} us CPU/put, {data['ms_per_group']:.2f} ms/group; nothing synced "
          f"{neither['puts_per_s']:.0f} puts/s, {neither['cpu_us_per_put']:.0f} us CPU/put; the index is {share:.0%} "
          f"of a synced group's time")


if __name__ == "__main__":
    main()
