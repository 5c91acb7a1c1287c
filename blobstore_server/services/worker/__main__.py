"""`python -m blobstore_server.services.worker -c worker.json`"""

from __future__ import annotations

import asyncio

from blobstore_server.libs import cpugroup
from blobstore_server.libs.proto.worker import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient, keep_registered
from blobstore_server.services.scheduler.client import SchedulerClient
from blobstore_server.services.worker.app import build_app
from blobstore_server.services.worker.config import WorkerConfig
from blobstore_server.services.worker.metrics import migrate_figures, repair_figures
from blobstore_server.services.worker.migrate import UnitMigrator
from blobstore_server.services.worker.repair import ShardRepairer
from blobstore_server.services.worker.tasks import TaskRunner


def build(config: WorkerConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    group = cpugroup.enter_idle_group() if config.idle_cpu else None
    if group is not None:
        async def leave_group() -> None:
            await asyncio.to_thread(cpugroup.leave_idle_group, group)

        life.close(leave_group)
    cluster = ClusterClient(config.clustermgr_hosts)
    blobnodes = BlobnodeClient()
    life.loop(lambda: keep_registered(cluster, "worker", config.advertised_host, config.idc, config.register_ttl))
    life.close(cluster.close, blobnodes.close)
    repairer = ShardRepairer(cluster, blobnodes, config.shard_timeout)
    register_collector(lambda: repair_figures(repairer.stats))
    migrator = UnitMigrator(cluster, blobnodes, config)
    register_collector(lambda: migrate_figures(migrator.stats))
    scheduler = SchedulerClient(cluster)
    life.close(scheduler.close)
    runner = TaskRunner(scheduler, migrator, config.advertised_host, config.task_poll,
                        lease_margin=config.lease_margin)
    urgent = TaskRunner(scheduler, migrator, config.advertised_host, config.task_poll, urgent_only=True,
                        lease_margin=config.lease_margin)
    for _ in range(config.task_runners):
        life.loop(runner.run)
    for _ in range(config.urgent_runners):
        life.loop(urgent.run)
    return build_app(repairer, life), config.bind_addr


if __name__ == "__main__":
    run_service("worker", WorkerConfig, build, routes=ROUTES)
