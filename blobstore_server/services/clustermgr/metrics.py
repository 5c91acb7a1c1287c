"""clustermgr's instruments updated as things happen: proposal latency, fenced commands. What is read at
scrape time is figures.py."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

FENCED = Counter("blobstore_clustermgr_fenced_total",
                 "Commands refused because they were sent under a superseded lease epoch, by lease", ["key"])
VOLUMES_CREATED = Counter("blobstore_clustermgr_volumes_created_total",
                          "Volumes this replica created as leader, by why: `floor` (too few writable or unleased ones)"
                          " or `avoiding` (none an allocator could lease kept clear of the disks its writers avoid:"
                          " a sign of hosts that stopped answering before their heartbeats lapsed)", ["why"])
VOLUME_CREATIONS_FAILED = Counter("blobstore_clustermgr_volume_creations_failed_total",
                                  "Volume creations that failed (no placement, or a blobnode did not create its "
                                  "chunk), by code mode: each round retries; while this grows the mode stays short of "
                                  "its floors", ["code_mode"])
PROPOSAL_SECONDS = Histogram("blobstore_clustermgr_proposal_seconds",
                             "From proposing a command to its result applied here, by command",
                             ["op"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0))
MOVES_REFUSED = Counter("blobstore_clustermgr_moves_refused_total",
                        "Unit switches refused because the destination lacked blobs the unit holds (a move not done, "
                        "or a forged one)")
