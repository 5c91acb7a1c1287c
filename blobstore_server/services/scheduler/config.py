"""Scheduler configuration (`python -m blobstore_server.services.scheduler -c scheduler.json`)."""

from __future__ import annotations

from pydantic import Field

from blobstore_server.libs.rpc.config import ServiceSettings


class SchedulerConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:9800"
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>; also its name in the election
    idc: str = "z0"
    clustermgr_hosts: list[str] = Field(min_length=1)
    election_ttl: float = Field(6.0, gt=0)  # a standby takes over this long after the active one went silent
    task_lease_ttl: float = Field(10.0, gt=0)  # a task not renewed for this long goes back to the queue
    round_interval: float = Field(1.0, gt=0)  # disks watched, tasks prepared and finished this often
    max_prepared: int = Field(20, ge=1)  # tasks with a destination at once (each holds a new chunk)
    # A disk silent this long counts as lost when judging how many more losses a volume can take (its margin):
    # volumes at margin <= 1 are repaired first, past the background caps and `max_prepared`.
    disk_lost_after: float = Field(30.0, gt=0)
    cancel_hold: float = Field(5.0, ge=0)  # a cancelled task waits this long before it is handed out again
    keep_finished: float = Field(86_400.0, ge=0)  # final task records are deleted after this long
    # balance: move a unit when the fullest and the emptiest disk (units per disk, same AZ) differ by this many
    balance_threshold: int = Field(4, ge=2)
    balance_per_hour: int = Field(30, ge=1)  # balance tasks created per hour at most
    # volume inspection: a batch of volumes compared unit by unit every interval; a finding counts only when
    # a second look this many seconds later agrees (a PUT in flight is not a missing shard)
    inspect_interval: float = Field(300.0, gt=0)
    inspect_batch: int = Field(100, ge=1)
    inspect_confirm: float = Field(10.0, ge=0)
    register_ttl: float = Field(10.0, gt=0)

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"
