"""`python -m blobstore_server.services.mqproxy -c mqproxy.json`"""

from __future__ import annotations

import asyncio

from blobstore_server.libs.mq.admin import ensure_topics
from blobstore_server.libs.mq.producer import Producer
from blobstore_server.libs.mq.settings import client_auth
from blobstore_server.libs.proto.mqproxy import ROUTES
from blobstore_server.libs.rpc.metrics import register_collector
from blobstore_server.libs.rpc.server import ASGIApp, Lifecycle, run_service
from blobstore_server.services.clustermgr.client import ClusterClient, keep_registered
from blobstore_server.services.mqproxy.app import Publisher, build_app
from blobstore_server.services.mqproxy.config import MqProxyConfig
from blobstore_server.services.mqproxy.metrics import publisher_figures


class SealingPublisher(Publisher):
    """A publisher whose producer seals every message with the cluster's message key (libs/mq/seal.py).

    It also logs in to Kafka as its own user when the config has `kafka_auth`.
    A subclass here rather than a change to `Publisher` only because app.py was being edited at the same time;
    it can fold into `Publisher.connect` (`Producer.connect(..., seal_key=key, **login)`)."""

    def __init__(self, config: MqProxyConfig) -> None:
        super().__init__(config.kafka_bootstrap, config.partitions, config.cluster_id, config.confirm_timeout)
        self.seal_key = bytes.fromhex(config.message_key) if config.message_key else None
        self.login = client_auth(config.kafka_auth)

    async def connect(self) -> None:
        """`Publisher.connect` with the seal and the login: create missing topics, then connect the producer."""
        await asyncio.to_thread(ensure_topics, self.bootstrap, self.partitions, client=self.login)
        self.producer = await Producer.connect(self.bootstrap, client_id="mqproxy", seal_key=self.seal_key,
                                               **self.login)


def build(config: MqProxyConfig) -> tuple[ASGIApp, str]:
    life = Lifecycle()
    cluster = ClusterClient(config.clustermgr_hosts)
    publisher = SealingPublisher(config)
    life.loop(lambda: keep_registered(cluster, "mqproxy", config.advertised_host, config.idc, config.register_ttl))
    life.close(publisher.close, cluster.close)
    register_collector(lambda: publisher_figures(publisher.stats))
    return build_app(publisher, life), config.bind_addr


if __name__ == "__main__":
    run_service("mqproxy", MqProxyConfig, build, routes=ROUTES)
