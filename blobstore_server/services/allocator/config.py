"""Allocator configuration (`python -m blobstore_server.services.allocator -c allocator.json`)."""

from __future__ import annotations

from pydantic import Field

from blobstore_server.libs.ec import CodeMode, CodeModeName
from blobstore_server.libs.rpc.config import ServiceSettings


class AllocatorConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:9100"
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>; also the lease holder name
    clustermgr_hosts: list[str] = Field(min_length=1)
    code_modes: list[CodeModeName] = Field(default_factory=lambda: [CodeMode.EC3P3])
    volumes_per_mode: int = Field(4, ge=1)  # writable volumes leased and kept allocatable per code mode
    max_volumes_per_mode: int = Field(16, ge=1)  # at most this many leased per mode, however many are unwritable
    bid_batch: int = Field(10_000, ge=1)  # bids fetched from the clustermgr scope at a time
    retain_interval: float = Field(5.0, gt=0)  # must be well below clustermgr's volume_lease_ttl
    lease_margin: float = Field(2.0, ge=0)  # stop allocating from a volume this long before its lease ends
    refill_interval: float = Field(0.5, gt=0)

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"
