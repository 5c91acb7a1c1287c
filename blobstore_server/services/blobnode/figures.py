"""The blobnode's figures read at scrape time: each disk's space, trash, chunks, queued I/O, background I/O and
scrub."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.rpc.metrics import counter, gauge
from blobstore_server.services.blobnode.node import Blobnode
from blobstore_server.services.blobnode.scrubber import Scrubber


def disk_figures(node: Blobnode) -> Iterator[Metric]:
    stats = [disk.stat() for disk in node.disks.values()]
    per_disk = {
        "size_bytes": ("Capacity of the disk's filesystem", [s.size for s in stats]),
        "used_bytes": ("Bytes used on the disk's filesystem", [s.used for s in stats]),
        "free_bytes": ("Bytes free on the disk's filesystem", [s.free for s in stats]),
        "trash_bytes": ("Bytes on disk of the chunk files in the disk's .trash/ (released or compacted away, "
                        "removed trash_hold seconds after)", [s.trash_bytes for s in stats]),
        "trash_files": ("Chunk files in the disk's .trash/", [s.trash_files for s in stats]),
        "chunks": ("Chunks on the disk", [s.chunks for s in stats]),
        "readonly_chunks": ("Read-only chunks on the disk", [s.readonly_chunks for s in stats]),
        "io_pending": ("Disk operations queued or running on the disk's I/O threads",
                       [node.io_pending[s.disk_id] for s in stats]),
        "background_queued": ("Background requests waiting for a slot or for the disk's background rate",
                              [node.gates[s.disk_id].queued for s in stats]),
        "background_running": ("Background requests holding one of the disk's background slots",
                               [node.gates[s.disk_id].running for s in stats]),
    }
    for name, (doc, values) in per_disk.items():
        yield gauge(f"blobstore_blobnode_disk_{name}", doc,
                    [((str(s.disk_id),), v) for s, v in zip(stats, values, strict=True)], ["disk_id"])
    yield counter("blobstore_blobnode_disk_io_errors", "Failed disk system calls counted against the disk "
                  "(io_errors_broken of them within io_errors_window and it is reported broken)",
                  [((str(s.disk_id),), node.faults.totals[s.disk_id]) for s in stats], ["disk_id"])
    yield gauge("blobstore_blobnode_background_rate_bytes", "Bytes per second each disk's background I/O may move now "
                "(it yields to user requests, between background_min_mb_per_sec and background_mb_per_sec)",
                node.background_rate.rate)
    yield counter("blobstore_blobnode_disk_background_bytes", "Bytes moved by background requests (capped per disk)",
                  [((str(disk_id),), gate.bytes) for disk_id, gate in node.gates.items()], ["disk_id"])


# Each disk's scrub, from its ScrubStat: (name, kind, doc, field); counters are totals kept in the disk's record.
SCRUB_FIGURES = (
    ("enabled", gauge, "1 if the disk is scrubbed (scrub_period > 0)", "enabled"),
    ("progress", gauge, "Fraction of the disk's current scrub pass read (1 between passes)", "progress"),
    ("running", gauge, "1 while a scrub pass of the disk is under way", "running"),
    ("last_pass_timestamp_seconds", gauge, "Unix time the disk's last full scrub pass ended (0: none yet)",
     "last_full_pass"),
    ("passes", counter, "Full scrub passes of the disk", "passes"),
    ("shards", counter, "Shards read and checked by the disk's scrub", "shards"),
    ("bytes", counter, "Shard bytes read and checked by the disk's scrub", "bytes"),
    ("corrupt", counter, "Shards the disk's scrub found corrupt or unreadable", "corrupt"),
    ("repairs_queued", counter, "Repairs of scrub findings mqproxy took", "repairs_queued"),
    ("repairs_owed", gauge, "Scrub findings whose repair mqproxy has not taken yet", "repairs_owed"),
    ("rate_bytes", gauge, "Bytes per second the disk's scrub reads at: what its pass has left over what its period "
     "has left, at most scrub_mb_per_sec", "rate"),
    ("late_seconds", gauge, "Seconds past the end of its period the disk's current (or next) scrub pass ends even at "
     "scrub_mb_per_sec (0: on time); above 0, raise the cap or the period", "late_s"),
)


def scrub_figures(scrubber: Scrubber) -> Iterator[Metric]:
    stats = {disk_id: scrubber.stat(disk_id).model_dump() for disk_id in scrubber.disks}
    for name, kind, doc, field in SCRUB_FIGURES:
        yield kind(f"blobstore_blobnode_scrub_{name}", doc,
                   [((str(disk_id),), float(stat[field] or 0)) for disk_id, stat in stats.items()], ["disk_id"])
