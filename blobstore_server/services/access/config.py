"""Access configuration (`python -m blobstore_server.services.access -c access.json`)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from blobstore_server.libs.ec import CodeMode, CodeModeName
from blobstore_server.libs.rpc.config import ServiceSettings


class ClusterHosts(BaseModel):
    """Another cluster of the region (as in CubeFS BlobStore): its id and where its services answer."""

    cluster_id: int = Field(ge=0, lt=2**32)
    clustermgr_hosts: list[str] = Field(min_length=1)
    allocator_hosts: list[str] = Field(min_length=1)
    mqproxy_hosts: list[str] = Field(default_factory=list)  # empty: the mqproxies registered in its clustermgr


class AccessConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:9500"
    cluster_id: int = Field(1, ge=0, lt=2**32)
    secret: str = Field(min_length=8)  # signs Locations; the same on every access node of a cluster
    clustermgr_hosts: list[str] = Field(min_length=1)
    allocator_hosts: list[str] = Field(min_length=1)
    mqproxy_hosts: list[str] = Field(default_factory=list)  # empty: the mqproxies registered in clustermgr
    region: list[ClusterHosts] = Field(default_factory=list)  # more clusters behind this access layer
    region_refresh: float = Field(10.0, gt=0)  # seconds between looks at each cluster's free space
    redis_url: str = ""  # optional second-level volume cache, e.g. redis://127.0.0.1:6379/0 (rediss://: over TLS)
    redis_ca_file: str = ""  # the CA (PEM) a rediss:// server's certificate chains to; "": the system's
    redis_timeout: float = Field(1.0, gt=0)  # seconds per Redis call or connect: past it, clustermgr answers
    blob_size: int = Field(4 << 20, ge=64 << 10, le=32 << 20)
    max_object_size: int = Field(5 << 30, ge=1)
    default_code_mode: CodeModeName = CodeMode.EC3P3  # when clustermgr publishes no size policy
    shard_timeout: float = Field(10.0, gt=0)
    # Small shard puts (reads) to a blobnode beyond this many puts (reads) on their way ride together in one
    # request (0: never); blobnodes must serve /shard/put_batch and /shard/get_batch, so upgrade them first.
    shard_calls_in_flight: int = Field(1, ge=0)
    put_grace: float = Field(1.0, gt=0)  # seconds the shards beyond the put quorum are waited for once it holds
    hedge_after: float = Field(0.5, gt=0)  # a data shard slower than this triggers a degraded read
    # A small read (at most `tail_hedge_bytes` a shard) whose data shards take longer than this quantile of recent
    # small reads did (at least `tail_hedge_min` s) also asks other shards and decodes from the first N (tail.py);
    # 0: only the hedge above.
    tail_hedge_quantile: float = Field(0.95, ge=0, lt=1)
    tail_hedge_min: float = Field(0.002, gt=0)
    tail_hedge_bytes: int = Field(256 << 10, ge=0)
    read_ahead: int = Field(2, ge=1, le=16)  # blobs of an object read from blobnodes ahead of the one being sent
    # A GET of at least this many bytes whose client accepts a read plan (the SDK does) is answered with where the
    # data shards' bytes are, signed for it to read them from the blobnodes itself, up to `direct_plan_bytes` a plan;
    # 0: never (clients that cannot reach the blobnodes).
    direct_reads_from: int = Field(4 << 20, ge=0)
    direct_plan_bytes: int = Field(64 << 20, ge=1 << 20)
    put_tries: int = Field(3, ge=1)  # a blob that misses its quorum is tried on this many volumes in all
    put_retry_window: float = Field(20.0, gt=0)  # no new try of a blob once its first began this long ago
    disk_punish: float = Field(10.0, gt=0)  # seconds a failed disk is skipped by PUTs and read last
    volume_punish: float = Field(30.0, gt=0)  # seconds a volume where a blob missed its quorum is not used
    volume_cache_ttl: float = Field(60.0, gt=0)
    # Small objects take bids and bytes from a reservation (services/access/reserve.py): this many bids and
    # bytes per reservation (0 bids: an allocator call per object), used for at most `reserve_ttl` seconds,
    # which must stay below the allocator's lease_margin (2 s by default).
    reserve_bids: int = Field(64, ge=0, le=65536)
    reserve_bytes: int = Field(4 << 20, ge=16)
    reserve_ttl: float = Field(1.0, gt=0)
    allocator_timeout: float = Field(1.0, gt=0)  # seconds an allocator has to answer before the next is tried
    allocator_punish: float = Field(10.0, gt=0)  # seconds an allocator that did not answer is passed over
    # Space held to ride out an allocator outage (services/access/standby.py): `standby_ride_out` seconds of
    # the recent PUT rate, `standby_headroom` times over, in grants of these bounds, looked after every
    # `standby_refill` seconds. clustermgr's volume_lease_ttl must exceed ride_out + refill + the allocator's
    # retain_interval and lease_margin. 0 s turns it off.
    # A 30 s outage and the restarts after it: restarting 3 clustermgrs and 2 allocators took 15-25 s here.
    standby_ride_out: float = Field(60.0, ge=0)
    standby_headroom: float = Field(2.0, ge=1)
    standby_min_bids: int = Field(128, ge=1, le=65536)
    standby_max_bids: int = Field(16384, ge=1, le=65536)
    standby_min_bytes: int = Field(16 << 20, ge=1)
    standby_max_bytes: int = Field(512 << 20, ge=1)
    standby_refill: float = Field(2.0, gt=0)
    upload_ttl: float = Field(86400.0, gt=0, le=30 * 86400)  # seconds a multipart upload's tokens are valid
    # tinker's delete_safe_delay (`cluster up` and `deploy render` set both): seconds within which an undelete can
    # take a DELETE back; only said in an undelete's answer once the shards are gone
    delete_safe_delay: float = Field(4 * 3600.0, ge=0)
    # Seconds an undelete's record stays in clustermgr past the safe delay (services/access/undelete.py): a delete
    # message tinker had still not finished by then (retried that long: a blobnode away for over a week) would be
    # carried out after all. Past Kafka's default retention (7 days): a message nobody consumed is gone by then.
    undelete_keep: float = Field(8 * 86400.0, gt=0, le=180 * 86400)
    orphan_log: str = "access-orphans.jsonl"  # shards a failed PUT left behind, for the delete pipeline
    # What this node owes and holds (repair and delete messages not yet taken by mqproxy, the standby grants), kept
    # across a crash and taken up again at start (services/access/statefile.py); one file per access node.
    state_file: str = "access-state.sqlite"
    audit_log: str = "access-audit.jsonl"  # one JSON line per request; empty: no audit log
    audit_log_max_bytes: int = Field(64 << 20, ge=4096)  # then it rotates to audit_log.1, .2, ...
    audit_log_backups: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _distinct_clusters(self) -> AccessConfig:
        ids = [self.cluster_id, *(c.cluster_id for c in self.region)]
        if len(set(ids)) != len(ids):
            raise ValueError(f"cluster ids of the region must differ: {ids}")
        return self

    def clusters(self) -> list[ClusterHosts]:
        """Every cluster this access layer serves, its own first."""
        own = ClusterHosts(cluster_id=self.cluster_id, clustermgr_hosts=self.clustermgr_hosts,
                           allocator_hosts=self.allocator_hosts, mqproxy_hosts=self.mqproxy_hosts)
        return [own, *self.region]
