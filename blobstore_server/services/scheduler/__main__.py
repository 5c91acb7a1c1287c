"""`python -m blobstore_server.services.scheduler -c scheduler.json`"""

from __future__ import annotations

from blobstore_server.libs.proto.scheduler import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient, keep_registered
from blobstore_server.services.mqproxy.client import MqProxyClient
from blobstore_server.services.scheduler.app import build_app
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.inspect import VolumeInspector
from blobstore_server.services.scheduler.metrics import scheduler_figures
from blobstore_server.services.scheduler.mirror import VolumeMirror
from blobstore_server.services.scheduler.scheduler import Scheduler


def build(config: SchedulerConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    cluster = ClusterClient(config.clustermgr_hosts)
    blobnodes = BlobnodeClient()
    mq = MqProxyClient(cluster=cluster)
    volumes = VolumeMirror(cluster)
    inspector = VolumeInspector(cluster, volumes, blobnodes, mq, config.inspect_batch, config.inspect_confirm)
    elections = ClusterClient(config.clustermgr_hosts)  # unfenced: campaigning and staying registered as standby
    scheduler = Scheduler(config, cluster, volumes, blobnodes, inspector, elections)
    register_collector(lambda: scheduler_figures(scheduler))
    life.loop(lambda: keep_registered(elections, "scheduler", config.advertised_host, config.idc,
                                      config.register_ttl))
    life.loop(scheduler.campaign)
    life.loop(scheduler.run)
    life.loop(scheduler.inspect)
    life.close(cluster.close, elections.close, blobnodes.close, mq.close)
    return build_app(scheduler, life), config.bind_addr


if __name__ == "__main__":
    run_service("scheduler", SchedulerConfig, build, routes=ROUTES)
