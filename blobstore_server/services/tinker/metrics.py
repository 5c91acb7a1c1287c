"""tinker's figures: each pipeline's counters read at scrape time, and its consumer group's Kafka lag,
which takes Kafka round trips and so is refreshed in the background, not during a scrape."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client.core import Metric

from blobstore_server.libs.rpc.metrics import counter, gauge
from blobstore_server.services.tinker.tinker import Tinker

log = logging.getLogger(__name__)
LAG_REFRESH = 30.0  # seconds between lag reads (Kafka round trips)


class TinkerFigures:
    def __init__(self, tinker: Tinker) -> None:
        self.tinker = tinker
        self.lag: dict[str, int] = {}  # pipeline -> messages not yet committed

    async def refresh_lag(self) -> None:
        while True:
            try:
                stats = await self.tinker.stats()
                self.lag = {name: p.total_lag for name, p in stats.pipelines.items()}
            except Exception as exc:  # Kafka away: keep the last figures, try again later
                log.warning("cannot read the consumer lag: %s", exc)
            await asyncio.sleep(LAG_REFRESH)

    def collect(self) -> Iterator[Metric]:
        pipelines = self.tinker.pipelines.items()
        for field, doc in (("messages_in", "Messages consumed"), ("done", "Messages whose work is done"),
                           ("failed", "Messages whose work failed (handed on to the failed topic)"),
                           ("retried", "Messages handed on for a later retry"),
                           ("undeleted", "Deletes an undelete took back before their purge")):
            yield counter(f"blobstore_tinker_{field}", f"{doc}, by pipeline",
                          [((name, ), getattr(p.stats, field)) for name, p in pipelines], ["pipeline"])
        yield counter("blobstore_tinker_messages_forged", "Messages skipped, unacted upon, for a missing or wrong "
                      "seal (written to Kafka by someone without the message key), by topic",
                      [((topic,), n) for topic, n in sorted(self.tinker.forged.items())], ["topic"])
        yield gauge("blobstore_tinker_kafka_lag", f"Messages not yet committed by the pipeline's consumer group "
                    f"(read every {LAG_REFRESH:g} s)", [((name,), n) for name, n in self.lag.items()], ["pipeline"])
