"""Repair and delete messages this access node owes mqproxy, kept until mqproxy takes them.

A PUT that left shards unwritten, or a failed PUT's leftovers, must reach the repair or delete pipeline even when
mqproxy or Kafka is cut off for a while: the request does not wait for it, so nothing else would ever send the
message again. The outbox holds them (bounded), sends them in batches in the background and, after a refusal,
tries again with a growing pause. Each message is also kept in the access node's state file (statefile.py) from
when it is queued until mqproxy takes it, and queued again when the node starts: a crash does not lose it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from blobstore_server.libs.proto.mqproxy import DeleteIn, RepairIn
from blobstore_server.libs.rpc.errors import RpcError
from blobstore_server.services.access.metrics import OUTBOX_DROPPED, OUTBOX_HELD
from blobstore_server.services.access.statefile import Saving, StateFile
from blobstore_server.services.mqproxy.client import MqProxyClient

M = TypeVar("M", RepairIn, DeleteIn)
FIRST_PAUSE = 0.2
LAST_PAUSE = 5.0

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, mq: MqProxyClient, state: StateFile, cluster_id: int, limit: int = 100_000,
                 batch: int = 256) -> None:
        self.mq = mq
        self.state = state
        self.cluster_id = cluster_id
        self.limit = limit
        self.batch = batch
        self.repairs: deque[tuple[int, RepairIn]] = deque()  # (id in the state file, message)
        self.deletes: deque[tuple[int, DeleteIn]] = deque()
        self._waiting = asyncio.Event()
        for message_id, message in state.messages(cluster_id):
            if isinstance(message, RepairIn):
                self.repairs.append((message_id, message))
            else:
                self.deletes.append((message_id, message))
        if len(self):
            log.info("cluster %d: %d message(s) kept from before the start to send again", cluster_id, len(self))
            OUTBOX_HELD.set(len(self))
            self._waiting.set()

    def __len__(self) -> int:
        return len(self.repairs) + len(self.deletes)

    def repair(self, message: RepairIn) -> Saving:
        """Queue a repair; done once it is in the state file."""
        return self._add(self.repairs, [message], "repair")

    def delete(self, messages: Sequence[DeleteIn]) -> Saving:
        return self._add(self.deletes, messages, "delete")

    def _add(self, queue: deque[tuple[int, M]], messages: Sequence[M], kind: str) -> Saving:
        room = max(self.limit - len(self), 0)
        if len(messages) > room:
            OUTBOX_DROPPED.labels(kind).inc(len(messages) - room)
            log.error("outbox full (%d messages): %d %s message(s) dropped", self.limit, len(messages) - room, kind)
            messages = messages[:room]
        ids, saving = self.state.add_messages(self.cluster_id, kind, messages)
        queue.extend(zip(ids, messages, strict=True))
        OUTBOX_HELD.set(len(self))
        self._waiting.set()
        return saving

    async def run(self) -> None:
        """Send what is held, for ever (a Lifecycle loop)."""
        pause = FIRST_PAUSE
        while True:
            await self._waiting.wait()
            if await self.flush():
                pause = FIRST_PAUSE
                if not len(self):
                    self._waiting.clear()
            else:
                await asyncio.sleep(pause)
                pause = min(pause * 2, LAST_PAUSE)

    async def flush(self) -> bool:
        """Send everything held; False at the first refusal (what was not taken stays, in order)."""
        return (await self._send(self.repairs, self.mq.send_repair, "repair")
                and await self._send(self.deletes, self.mq.send_delete, "delete"))

    async def _send(self, queue: deque[tuple[int, M]], send: Callable[[list[M]], Awaitable[int]], kind: str
                    ) -> bool:
        while queue:
            batch = [queue[i] for i in range(min(self.batch, len(queue)))]
            try:
                await send([message for _, message in batch])
            except RpcError as exc:
                log.warning("mqproxy did not take %d %s message(s), %d held, trying again: %s", len(batch), kind,
                            len(self), exc)
                return False
            for _ in batch:
                queue.popleft()
            self.state.sent([message_id for message_id, _ in batch])
            OUTBOX_HELD.set(len(self))
        return True
