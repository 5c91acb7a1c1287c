"""mqproxy configuration (`python -m blobstore_server.services.mqproxy -c mqproxy.json`)."""

from __future__ import annotations

from pydantic import Field

from blobstore_server.libs.mq.settings import MessageServiceSettings


class MqProxyConfig(MessageServiceSettings):
    bind_addr: str = "127.0.0.1:9600"
    host: str = ""  # advertised URL; defaults to http(s)://<bind_addr>
    idc: str = "z0"
    cluster_id: int = Field(1, ge=0, lt=2**32)  # stamped on every message; tinker takes only its own
    clustermgr_hosts: list[str] = Field(min_length=1)
    partitions: int = Field(4, ge=1)  # for topics this proxy creates when they are missing
    register_ttl: float = Field(10.0, gt=0)
    # Seconds a request waits for Kafka to confirm its messages before answering 503; the messages stay with
    # the producer, which keeps trying for two minutes, so a 503 means "not known", never "not queued".
    confirm_timeout: float = Field(5.0, gt=0)

    @property
    def advertised_host(self) -> str:
        return self.host or f"{self.scheme}://{self.bind_addr}"
