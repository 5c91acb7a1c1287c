"""Worker configuration (`python -m blobstore_server.services.worker -c worker.json`)."""

from __future__ import annotations

from pydantic import Field

from blobstore_server.libs.rpc.config import ServiceSettings


class WorkerConfig(ServiceSettings):
    bind_addr: str = "127.0.0.1:9300"
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>
    idc: str = "z0"
    clustermgr_hosts: list[str] = Field(min_length=1)
    shard_timeout: float = Field(30.0, gt=0)
    register_ttl: float = Field(10.0, gt=0)
    # unit migration (disk repair, drop, balance): shards moved at once per task, bytes per piece, progress
    # reports. One at a time by default: on a box whose CPU users share, moves run at once come as bursts that user
    # requests queue behind (bench/repair.py, 3 alternated pairs: user p99 during a rebuild PUT 1.25-1.95x and GET
    # 1.6-2.8x of baseline at 1, vs 2.2-2.8x and 2.4-5.4x at 8) and rebuild no faster under load; a repair of a
    # volume one loss from losing blobs moves urgent_concurrency at once.
    migrate_concurrency: int = Field(1, ge=1, le=64)
    # Run in an idle cpu cgroup (libs/cpugroup.py) where one can be made, as the blobnodes' readers do: any user
    # request preempts the worker's decoding at once. bench/repair.py EC3P3, 2 alternated pairs, user p99 during a
    # rebuild over baseline: PUT 1.92 / 2.05x -> 0.79 / 1.51x, GET 2.24 / 2.84x -> 2.02 / 2.07x; the rebuild under
    # that load 0.73 / 0.57x -> 0.58 / 0.56x of the disks' limit. On a box whose CPU users keep busy, repairs then
    # wait for a spare moment, urgent ones too: off to run at normal weight.
    idle_cpu: bool = True
    urgent_concurrency: int = Field(8, ge=1, le=64)
    migrate_piece_bytes: int = Field(16 << 20, ge=1 << 16)
    migrate_report_interval: float = Field(3.0, gt=0)
    # MiB/s all of this worker's migrations write together; None: only the blobnodes' background caps apply.
    # On a box where the CPU, not the disks, is short, this is what keeps user latency down during a repair.
    migrate_mb_per_sec: float | None = Field(None, gt=0)
    # scheduler tasks (disk repair, drop, balance, manual migrate) worked at once, and how often to ask
    task_runners: int = Field(2, ge=0, le=16)
    task_poll: float = Field(0.5, gt=0)
    # runners that take only repairs of volumes one loss from losing blobs, so those never wait behind a
    # long ordinary move
    urgent_runners: int = Field(1, ge=0, le=4)
    # Part of a task's lease kept in hand: once (1 - lease_margin) x the lease has passed since the last renewal
    # that went through was sent, the worker stops touching the task (the scheduler may hand it out again at 1 x).
    lease_margin: float = Field(0.2, gt=0, lt=1)

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"
