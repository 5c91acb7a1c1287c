"""Blobnode configuration (`python -m blobstore_server.services.blobnode -c blobnode.json`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.rpc.config import ServiceSettings


class DiskConfig(BaseModel):
    path: str
    auto_format: bool = True
    max_chunks: int = Field(1024, ge=1)
    # Until clustermgr hands out disk ids, a new disk takes its id from here.
    disk_id: int | None = Field(None, ge=1, lt=2**32)


class BlobnodeConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:8889"
    cluster_id: int = Field(1, ge=0, lt=2**32)
    idc: str = "z0"  # the AZ
    rack: str = "r0"
    hostname: str = ""  # the machine's name: no two units of a volume on one; "": the URL (one machine, a host a port)
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>
    disks: list[DiskConfig] = Field(min_length=1)
    sync: bool = True  # fdatasync shard bytes before acknowledging; off only for throwaway benchmarks
    io_threads_per_disk: int = Field(4, ge=1, le=64)  # user I/O
    # Background I/O (repair, migration, inspection, compaction, deletes) per disk: its own threads, at most
    # background_concurrency operations at a time and at most background_mb_per_sec MiB/s on average; user I/O
    # is never queued behind it. The rate yields to users (services/blobnode/iolimit.py): the ceiling while no
    # user request arrives; while users are served, halved whenever the event loop lags more than
    # background_yield_lag_ms (90th percentile over a quarter second), else grown a step at a time, never below
    # background_min_mb_per_sec (repair always moves). background_yield_lag_ms 0: background_mb_per_sec, fixed.
    background_mb_per_sec: float = Field(512.0, gt=0)
    background_min_mb_per_sec: float = Field(8.0, gt=0)
    background_yield_lag_ms: float = Field(2.0, ge=0)
    background_concurrency: int = Field(4, ge=1, le=64)
    # The threads doing a disk's background I/O run this many nice levels below the process, so where the CPU is
    # contended the kernel runs the threads serving users first (nice only weighs CPU shares: no starvation, and
    # no effect on an idle box). 10 vs 0 (bench/repair.py EC3P3 1 GiB, 6 alternated pairs): median user p99
    # during the rebuild PUT 1.60 -> 1.46x, GET 2.35 -> 2.08x of baseline (better in 4 of 6 pairs each), rebuild
    # rate within noise (loaded median 24.4 vs 22.2 MB/s, idle 45.5 vs 45.0).
    background_nice: int = Field(10, ge=0, le=19)
    # Background shard reads (repair, migration, inspection) are served by a child process at SCHED_IDLE, started
    # on the first one (services/blobnode/reader_app.py): the kernel then runs users first wherever the CPU is
    # short. Off: the blobnode serves them itself, on its background threads.
    background_reader: bool = True
    # Shards of at least direct_write_bytes, and every background one (rebuilt, migrated: nobody reads them soon),
    # skip the page cache (O_DIRECT, page-aligned, from a reused buffer): no copy into fresh page-cache pages and no
    # writeback later, so less CPU per MB, and large or background bytes do not push small objects' pages out (a
    # large shard read right after is read from the disk). 0: every shard through the page cache. Where the file
    # system refuses O_DIRECT they are written as before.
    direct_write_bytes: int = Field(1 << 20, ge=0)
    default_chunk_size: int = Field(16 << 30, ge=1 << 20)
    max_shard_size: int = Field(64 << 20, ge=1)
    clustermgr_hosts: list[str] = Field(default_factory=list)  # empty: run standalone
    heartbeat_interval: float = Field(3.0, gt=0)
    # A disk whose system calls failed this many times within io_errors_window seconds (not counting a full disk
    # or the process out of descriptors) is reported broken to clustermgr; the scheduler then moves its units
    # elsewhere. Failures spread wider (a bad sector met now and then) do not condemn it (faults.py).
    io_errors_broken: int = Field(3, ge=1)
    io_errors_window: float = Field(600.0, gt=0)
    # Scrubbing (services/blobnode/scrub.py): every normal shard of a disk is read and its CRCs checked once per
    # `scrub_period` seconds (0: never), at stored bytes / period but at most `scrub_mb_per_sec`, as background
    # I/O of the disk (within its background caps); a shard that fails gets a repair queued through mqproxy.
    scrub_period: float = Field(14 * 86400.0, ge=0)
    scrub_mb_per_sec: float = Field(8.0, gt=0)
    # a shard marked deleted is deleted for good (/shard/delete, tinker's user deletes) only this many seconds after
    # its mark: tinker's delete_safe_delay, so a caller holding the delete capability alone cannot hurry a delete;
    # /shard/discard (repair and migration making room for the right bytes) takes another capability and no wait
    delete_hold: float = Field(4 * 3600.0, ge=0)
    # Upkeep (services/blobnode/upkeep.py), every upkeep_interval seconds per disk, as background I/O of the disk:
    # - trash: a chunk file released (its unit moved away) or compacted away waits in <disk>/.trash/ trash_hold
    #   seconds, so that an operator's mistake can still be undone (docs/operations.md "Trash"), then is removed, cut
    #   trash_purge_step bytes at a time from its end (ext4 here: removing 12 GiB in one unlink took 0.32 s of one
    #   thread and lifted a synced 4 KiB writer's p99 from 4 to 11 ms; in 1 GiB cuts, each took at most 74 ms and
    #   that p99 stayed at 3 ms);
    # - compaction (services/blobnode/compaction.py), unless auto_compact is off: a writable chunk whose garbage
    #   (extent no shard owns: deleted shards, failed puts) is at least compact_min_garbage bytes and
    #   compact_garbage_ratio of its used extent, and which took no write or delete for compact_idle seconds, is
    #   rewritten with its live shards only; its old file goes to trash.
    upkeep_interval: float = Field(30.0, gt=0)
    trash_hold: float = Field(24 * 3600.0, ge=0)
    trash_purge_step: int = Field(1 << 30, ge=1 << 20)
    auto_compact: bool = True
    compact_garbage_ratio: float = Field(0.5, gt=0, le=1)
    compact_min_garbage: int = Field(1 << 30, ge=0)
    compact_idle: float = Field(600.0, ge=0)
    # inspection exports are written only under these (absolute paths or URIs); none: every export is refused
    export_roots: list[str] = Field(default_factory=list)
    export_s3: S3Access | None = None  # whom s3:// export targets are written as (the cluster's gateway)

    @field_validator("disks")
    @classmethod
    def _distinct_paths(cls, disks: list[DiskConfig]) -> list[DiskConfig]:
        paths = [d.path for d in disks]
        if len(set(paths)) != len(paths):
            raise ValueError("two disks share a path")
        return disks

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"

    @property
    def export_bucket(self) -> S3Access | None:
        """`export_s3`, its gateway's certificate checked against this node's CA unless it names its own."""
        if self.export_s3 is None or self.export_s3.ca_file or self.tls is None:
            return self.export_s3
        return self.export_s3.model_copy(update={"ca_file": self.tls.ca_file})
