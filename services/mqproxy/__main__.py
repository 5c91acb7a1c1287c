"""`python -m services.mqproxy -c mqproxy.json`"""

from __future__ import annotations

from libs.rpc.metrics import register_collector
from libs.rpc.server import ASGIApp, Lifecycle, run_service
from services.clustermgr.client import ClusterClient, keep_registered
from services.mqproxy.app import Publisher, build_app
from services.mqproxy.config import MqProxyConfig
from services.mqproxy.metrics import publisher_figures


def build(config: MqProxyConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    cluster = ClusterClient(config.clustermgr_hosts)
    publisher = Publisher(config.kafka_bootstrap, config.partitions, config.cluster_id, config.confirm_timeout)
    life.loop(lambda: keep_registered(cluster, "mqproxy", config.advertised_host, config.idc, config.register_ttl))
    life.close(publisher.close, cluster.close)
    register_collector(lambda: publisher_figures(publisher.stats))
    return build_app(publisher, life), config.bind_addr


if __name__ == "__main__":
    run_service("mqproxy", MqProxyConfig, build)
