"""Read survivors and decode: the one rebuild step shared by shard repair and unit migration.

Reads only as many survivors as the code needs (N), more only when some fail or the code asks for
more (an LRC stripe with too many local losses); shards already in hand are used first, unread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence

from blobstore_server.libs.ec import Codec, NotEnoughShards
from blobstore_server.libs.proto.blobnode import NEEDS_REPAIR, ShardState, shard_state
from blobstore_server.libs.rpc.client import Payload
from blobstore_server.libs.rpc.errors import RpcError, Unavailable

ShardRead = Callable[[int], Awaitable[Payload | RpcError]]  # shard index -> its bytes, or why not
LASTING = NEEDS_REPAIR | {ShardState.DELETED}  # what a read says about the shard itself, not about its node


class RepairFailed(Unavailable):
    """Too few good shards to rebuild from now; the caller retries later. `lost`: every source was read and
    each that failed said so for good (missing, corrupt, deleted; none unreachable): retrying cannot help."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


async def rebuild_shards(codec: Codec, read: ShardRead, sources: Sequence[int], wanted: Sequence[int],
                         have: Mapping[int, Payload] | None = None) -> dict[int, bytes]:
    """Shards `wanted` of one blob, decoded from `sources` (indexes believed good). `have` holds survivors
    already read; the rest are read through `read`, a round at a time, until the decode succeeds."""
    got = {i: data for i, data in (have or {}).items() if i in sources}
    unread = [i for i in sources if i not in got]
    failures: list[str] = []
    lasting = True  # every failure so far says the shard is gone, not that its node is out of reach
    while True:
        if len(got) >= codec.tactic.n:
            shards = [got.get(i) for i in range(codec.tactic.total)]
            try:
                rebuilt = await asyncio.to_thread(codec.reconstruct, shards, wanted)
                return {i: bytes(rebuilt[i]) for i in wanted}
            except NotEnoughShards as exc:
                if not unread:
                    raise RepairFailed(f"{exc}; {'; '.join(failures)}", lost=lasting) from None
        elif not unread:
            raise RepairFailed(f"{len(got)} good shards of {codec.tactic.total}, need {codec.tactic.n}; "
                               f"{'; '.join(failures) or 'no other source'}", lost=lasting)
        batch, unread = unread[:max(1, codec.tactic.n - len(got))], unread[max(1, codec.tactic.n - len(got)):]
        for index, outcome in zip(batch, await asyncio.gather(*(read(i) for i in batch)), strict=True):
            if isinstance(outcome, RpcError):
                failures.append(f"shard {index}: {type(outcome).__name__}")
                lasting = lasting and shard_state(outcome) in LASTING
            else:
                got[index] = outcome
