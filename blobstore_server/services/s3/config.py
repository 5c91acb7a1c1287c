"""S3 gateway configuration (`python -m blobstore_server.services.s3 -c s3.json`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from blobstore_server.libs.rpc.config import ServiceSettings


class ServiceUser(BaseModel):
    """A user the cluster's own services sign as (the inspection's exports), with the buckets it owns: every
    gateway sets it up in the namespace at start, its keys derived from the cluster's secret."""

    name: str = Field(min_length=1)
    access_key: str = Field(min_length=16)
    secret_key: str = Field(min_length=32)
    buckets: list[str] = Field(default_factory=list)


class S3Config(ServiceSettings):
    bind_addr: str = "127.0.0.1:9400"  # (9800 is the scheduler's)
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>
    access_hosts: list[str] = Field(min_length=1)  # where object bytes go, through the project's SDK
    # Where buckets, keys, users and the GC outbox are: a SQLite file (the gateways of one machine), or a
    # PostgreSQL DSN, postgresql://user[:password]@host[:port]/database (any number of gateways)
    namespace: str = "s3/namespace.db"
    # Virtual-hosted style: a request to `<bucket>.<domain>` (Host) for one of these names that bucket, its path the
    # key (the domain and its subdomains resolve to the gateways: a wildcard DNS record). Path style always works.
    domains: list[str] = Field(default_factory=list)
    region: str = "us-east-1"  # what GetBucketLocation answers; requests signed for any region are taken
    segment_size: int = Field(8 << 20, ge=1 << 20, le=64 << 20)  # bytes of an object per Location
    max_object_size: int = Field(5 << 30, gt=0)  # a single PUT (S3's limit); multipart objects are sums of parts
    # Seconds an unreferenced Location waits in the GC outbox before it is deleted: a GET that read the old
    # manifest just before an overwrite finishes reading it
    gc_delay: float = Field(60.0, ge=0)
    reap_interval: float = Field(5.0, gt=0)
    # Seconds after which a PUT's intent is taken for a crashed gateway's and its blobs are reaped; longer than
    # the slowest PUT of max_object_size (a PUT still running past it fails at its commit)
    intent_ttl: float = Field(3600.0, gt=0)
    service_users: list[ServiceUser] = Field(default_factory=list)

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"
