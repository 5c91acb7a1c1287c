"""Typed async client of clustermgr: finds the leader, rides out a leader change, and sends every
mutating command in a client session so that a retry never applies it twice.

Every call goes to the replica believed to lead, and a calm call is that one request. A follower
answers `NotLeader` naming the leader, which is followed at once. When the replica does not answer
within `attempt_timeout` (paused, cut off, dead) or cannot serve, every replica is asked in parallel
who leads (`GET /raft/leader`, no state read) and the call goes there, with a longer attempt timeout
if that is the same replica again (it is alive, the request is just slow). All of this repeats
until `deadline` seconds have passed, which covers an election (well under 2 s).

A POST is a mutating command: it carries `SESSION_HEADER` (this client's id, the command's seq, and
the seqs it has settled), the same on every retry, so clustermgr answers a retry of a command that
already committed with its first answer (`services/clustermgr/sessions.py`).

`VolumeCache` (volume info for the data path, refetched when a unit moved) lives here too: it is a
client-side view of clustermgr's volume table, shared by access, tinker and the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

from blobstore_server.libs.ec import CodeMode
from blobstore_server.libs.proto import clustermgr as api
from blobstore_server.libs.proto.blobnode import MOVED_ERRORS
from blobstore_server.libs.proto.cluster import DiskInfo, DiskStatus, ServiceInfo, Unit, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import (
    KV_PAGE,
    SESSION_HEADER,
    ClusterStat,
    DiskAdd,
    DiskBeat,
    DiskHeartbeat,
    DiskRef,
    DiskSet,
    DiskView,
    EpochAsk,
    Fence,
    HeartbeatAnswer,
    KeyCas,
    KeyRef,
    KeyValue,
    KvItems,
    MemberAdd,
    MemberRemove,
    RaftStatus,
    ReplicaStatus,
    RetainItem,
    RetainResult,
    ScopeAlloc,
    ScopeRange,
    ServiceRef,
    ServiceRegister,
    Session,
    Undelete,
    UndeleteSlice,
    UnitAlloc,
    UnitRelease,
    UnitReleased,
    UnitUpdate,
    VolumeAlloc,
    VolumeHolder,
    VolumeList,
    VolumeRef,
    VolumeRetain,
    VolumeView,
    undelete_looks,
)
from blobstore_server.libs.rpc.client import HttpClient, Params, ServiceClient
from blobstore_server.libs.rpc.errors import NotFound, NotLeader, RpcError, Unavailable
from blobstore_server.libs.rpc.routes import Route

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)
# While clustermgr does not answer, an expired volume entry serves on after asking it for STALE_ASK seconds (not the
# client's deadline: a PUT waits on it), and for STALE_RETRY seconds more before it is asked again.
STALE_ASK = 1.0
STALE_RETRY = 5.0
T = TypeVar("T")


def _redis_errors() -> tuple[type[Exception], ...]:
    """What a Redis cache call may raise: redis-py's errors, and uvloop's RuntimeError for a pooled connection whose
    socket closed unseen (a Redis host cut off, then back): either way the cache is skipped, never a failed request.
    Imported here: only a process that hands in a Redis client (access) loads redis-py."""
    from redis.exceptions import RedisError

    return (RedisError, RuntimeError)


class SessionClock:
    """Numbers one client's mutating commands: each gets the next seq (its retries reuse it), and
    `acked` lets clustermgr forget every answer below the oldest command still in flight."""

    def __init__(self, client: str | None = None) -> None:
        self.client = client or secrets.token_hex(8)
        self.fence: Fence | None = None  # the lease every command is sent under, once its holder set it
        self._next = 1
        self._open: set[int] = set()

    @contextlib.contextmanager
    def command(self) -> Iterator[Callable[[], Session]]:
        """A new command; the callable stamps each attempt (acked moves on as other commands settle)."""
        seq = self._next
        self._next += 1
        self._open.add(seq)
        try:
            yield lambda: Session(client=self.client, seq=seq, acked=min(self._open) - 1, fence=self.fence)
        finally:
            self._open.discard(seq)


class ClusterClient(ServiceClient):
    def __init__(self, hosts: Sequence[str], *, http: HttpClient | None = None, deadline: float = 10.0,
                 attempt_timeout: float = 1.0, sessions: bool = True) -> None:
        """`sessions=False` sends mutating commands without a session (no retry protection; for the
        benchmark's baseline)."""
        if not hosts:
            raise ValueError("clustermgr client needs at least one host")
        super().__init__(api.ROUTES, http, timeout=deadline)
        self.hosts = [h.rstrip("/") for h in hosts]
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.session = SessionClock() if sessions else None
        self._leader = self.hosts[0]

    def fence(self, fence: Fence) -> None:
        """Send every later mutating command under `fence`: clustermgr refuses it (`Fenced`) once the lease has
        a newer epoch. Never unset: a holder that lost its lease must stay refused."""
        if self.session is None:
            raise ValueError("a fenced client needs sessions: the fence travels in the session header")
        self.session.fence = fence

    async def call(self, route: Route[M], *, params: Params | None = None, body: BaseModel | None = None,
                   deadline: float | None = None, held: float = 0.0) -> M:
        """`route` on the leader, found and followed for at most `deadline` (the client's) seconds; `held`: how
        long clustermgr may hold this request on purpose, waited for on top of each attempt's timeout."""
        deadline = self.deadline if deadline is None else deadline
        if route.method != "POST" or self.session is None:
            return await self._call(route, params, body, None, deadline, held)
        with self.session.command() as stamp:
            return await self._call(route, params, body, stamp, deadline, held)

    async def _call(self, route: Route[M], params: Params | None, body: BaseModel | None,
                    stamp: Callable[[], Session] | None, deadline: float, held: float) -> M:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + deadline
        host: str | None = self._leader
        suspect: str | None = None  # the replica that last failed to answer
        attempt = self.attempt_timeout + held
        timeout, delay, hops = attempt, 0.02, 0
        last: Exception = Unavailable("no attempt")
        while True:
            left = give_up - loop.time()
            if left <= 0:
                raise Unavailable(f"clustermgr {route.path}: no leader answered within {deadline}s: {last}")
            if host is None:  # no leader known yet (an election): ask again shortly
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 0.2)
                host = await self._who_leads(suspect)
                continue
            headers = {SESSION_HEADER: stamp().header()} if stamp else None
            try:
                answer = await self.http.call_route(route, host, params=params, body=body, headers=headers,
                                                    timeout=min(timeout, left))
                self._leader = host
                return answer
            except NotLeader as exc:
                last, hint = exc, exc.details.get("leader")
                hops += 1
                if hint and str(hint) not in (host, suspect) and hops <= len(self.hosts):
                    host = str(hint)  # a follower names the leader: go there at once
                    continue
                await asyncio.sleep(min(delay, left))  # no (other) leader known here: an election
                delay = min(delay * 2, 0.2)
            except Unavailable as exc:
                last, suspect = exc, host
            hops = 0
            found = await self._who_leads(suspect)
            # The same replica again: it is alive and leads, the request is slow; give it longer.
            timeout = timeout * 2 if found == host == suspect else attempt
            host = found

    async def _who_leads(self, suspect: str | None) -> str | None:
        """Ask every replica at once who leads (each within a quarter of the attempt timeout). The
        first that says it leads wins, the suspect too (it is alive then). Otherwise the newest
        term's hint, unless it names the suspect, which the others may not yet know is gone; then
        None, as when nobody knows a leader."""
        timeout = self.attempt_timeout / 4
        asks = {asyncio.ensure_future(self.http.call_route(api.RAFT_LEADER, h, timeout=timeout)): h
                for h in self.hosts}
        best: tuple[int, str] | None = None
        pending = set(asks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    with contextlib.suppress(RpcError):
                        view = task.result()
                        if view.role == "leader":
                            return asks[task]
                        if view.leader and (best is None or view.term > best[0]):
                            best = (view.term, view.leader.rstrip("/"))
                if all(asks[t] == suspect for t in pending) and (best is None or best[1] != suspect):
                    break  # only the suspect is left to hear from, and nobody points to it
            return best[1] if best and best[1] != suspect else None
        finally:
            for task in asks:
                if not task.done():
                    task.cancel()
                elif not task.cancelled():
                    task.exception()  # seen: an answer that came too late is not an error to log

    # disks

    async def alloc_disk_id(self) -> int:
        return (await self.call(api.DISK_ALLOC_ID)).disk_id

    async def add_disk(self, disk: DiskAdd) -> DiskInfo:
        return await self.call(api.DISK_ADD, body=disk)

    async def disk_heartbeat(self, disks: list[DiskBeat]) -> HeartbeatAnswer:
        return await self.call(api.DISK_HEARTBEAT, body=DiskHeartbeat(disks=disks), held=api.HEARTBEAT_HOLD_MAX)

    async def set_disk(self, disk_id: int, *, status: DiskStatus | None = None,
                       readonly: bool | None = None) -> DiskInfo:
        return await self.call(api.DISK_SET,
                               body=DiskSet(disk_id=disk_id, status=status, readonly=readonly))

    async def report_broken(self, disk_id: int) -> DiskInfo:
        """A blobnode's report that its disk fails (`set_disk` is the operator's, an admin route)."""
        return await self.call(api.DISK_BROKEN, body=DiskRef(disk_id=disk_id))

    async def get_disk(self, disk_id: int) -> DiskView:
        return await self.call(api.DISK_GET, params={"disk_id": disk_id})

    async def list_disks(self) -> list[DiskView]:
        """Each disk with `alive`: whether its blobnode heartbeats within the timeout."""
        return (await self.call(api.DISK_LIST)).disks

    # volumes

    async def get_volume(self, vid: int, deadline: float | None = None) -> VolumeView:
        return await self.call(api.VOLUME_GET, params={"vid": vid}, deadline=deadline)

    async def list_volumes(self, status: VolumeStatus | None = None,
                           code_mode: CodeMode | None = None) -> list[VolumeView]:
        """Each volume with whether new blobs may go to it now, and why not."""
        params: dict[str, str | int] = {}
        if status:
            params["status"] = status
        if code_mode is not None:
            params["code_mode"] = code_mode
        return (await self.call(api.VOLUME_LIST, params=params)).volumes

    async def volumes_changed_since(self, revision: int) -> VolumeList:
        """The volumes changed after `revision` (all for 0) and the revision of this answer, to ask with next."""
        return await self.call(api.VOLUME_LIST, params={"since": revision})

    async def alloc_volumes(self, code_mode: CodeMode, holder: str, count: int = 1,
                            avoid_disks: Sequence[int] = (), reclaim: bool = False,
                            largest_blob: int = 1) -> VolumeList:
        """Lease up to `count` volumes with room for a blob of `largest_blob` bytes, those with every unit up and
        none on `avoid_disks` first; with `reclaim`, also those `holder` leases already; each for the answer's
        `lease_for` seconds."""
        body = VolumeAlloc(code_mode=code_mode, holder=holder, count=count, avoid_disks=list(avoid_disks),
                           reclaim=reclaim, largest_blob=largest_blob)
        return await self.call(api.VOLUME_ALLOC, body=body)

    async def retain_volumes(self, holder: str, volumes: list[RetainItem]) -> RetainResult:
        body = VolumeRetain(holder=holder, volumes=volumes)
        return await self.call(api.VOLUME_RETAIN, body=body)

    async def release_volume(self, vid: int, holder: str) -> VolumeInfo:
        return await self.call(api.VOLUME_RELEASE, body=VolumeHolder(vid=vid, holder=holder))

    async def volume_full(self, vid: int) -> VolumeInfo:
        """The volume has no room left (a blobnode answered ChunkFull): retired from allocation (idempotent)."""
        return await self.call(api.VOLUME_FULL, body=VolumeRef(vid=vid))

    async def lock_volume(self, vid: int) -> VolumeInfo:
        return await self.call(api.VOLUME_LOCK, body=VolumeRef(vid=vid))

    async def unlock_volume(self, vid: int) -> VolumeInfo:
        return await self.call(api.VOLUME_UNLOCK, body=VolumeRef(vid=vid))

    async def alloc_unit(self, vid: int, index: int, *, disk_id: int | None = None,
                         avoid: Sequence[int] = ()) -> Unit:
        """Reserve the next epoch of unit `index` on `disk_id`, or on a disk the placement policy picks
        among all but `avoid`."""
        body = UnitAlloc(vid=vid, index=index, disk_id=disk_id, avoid=list(avoid))
        return await self.call(api.UNIT_ALLOC, body=body)

    async def release_unit(self, vid: int, vuid: int, disk_id: int | None = None) -> UnitReleased:
        """Conflict while `vuid` is the volume's live unit: its chunk must stay. With `disk_id`, the chunk's disk,
        the answer carries the release ticket a blobnode with auth requires."""
        return await self.call(api.UNIT_RELEASE, body=UnitRelease(vid=vid, vuid=vuid, disk_id=disk_id))

    async def epoch_ticket(self, epoch: int) -> str | None:
        """clustermgr's ticket for scheduler lease `epoch` (None without auth), which blobnodes with auth require of
        every chunk change a scheduler sends under it."""
        return (await self.call(api.EPOCH_TICKET, body=EpochAsk(epoch=epoch))).ticket

    async def update_unit(self, vid: int, index: int, vuid: int, disk_id: int, lost: Sequence[int] = ()
                          ) -> VolumeInfo:
        """Switch unit `index` to its reserved move, which must hold every blob the unit owes but `lost` ones."""
        body = UnitUpdate(vid=vid, index=index, vuid=vuid, disk_id=disk_id, lost=list(lost))
        return await self.call(api.UNIT_UPDATE, body=body, held=api.UNIT_CHECK_HOLD,
                               deadline=self.deadline + api.UNIT_CHECK_HOLD)

    # scopes, services, config, kv

    async def alloc_scope(self, name: str, count: int) -> ScopeRange:
        return await self.call(api.SCOPE_ALLOC, body=ScopeAlloc(name=name, count=count))

    async def register_service(self, name: str, host: str, idc: str = "", ttl: float = 30.0) -> ServiceInfo:
        body = ServiceRegister(name=name, host=host, idc=idc, ttl=ttl)
        return await self.call(api.SERVICE_REGISTER, body=body)

    async def service_heartbeat(self, name: str, host: str) -> ServiceInfo:
        return await self.call(api.SERVICE_HEARTBEAT, body=ServiceRef(name=name, host=host))

    async def list_services(self, name: str | None = None, alive_only: bool = True) -> list[ServiceInfo]:
        params: dict[str, str | int] = {"alive_only": int(alive_only)}
        if name:
            params["name"] = name
        return (await self.call(api.SERVICE_LIST, params=params)).services

    async def get_config(self, key: str) -> str | None:
        return (await self.call(api.CONFIG_GET, params={"key": key})).value

    async def set_config(self, key: str, value: str) -> None:
        await self.call(api.CONFIG_SET, body=KeyValue(key=key, value=value))

    async def list_config(self) -> dict[str, str]:
        return (await self.call(api.CONFIG_LIST)).config

    async def kv_get(self, key: str) -> str | None:
        return (await self.call(api.KV_GET, params={"key": key})).value

    async def kv_set(self, key: str, value: str) -> None:
        await self.call(api.KV_SET, body=KeyValue(key=key, value=value))

    async def kv_cas(self, key: str, expected: str | None, value: str | None) -> None:
        """Raises `Conflict` when the current value is not `expected`."""
        await self.call(api.KV_CAS, body=KeyCas(key=key, expected=expected, value=value))

    async def kv_delete(self, key: str) -> None:
        await self.call(api.KV_DELETE, body=KeyRef(key=key))

    async def kv_list(self, prefix: str = "") -> dict[str, str]:
        """Every key under `prefix`, read page by page."""
        items: dict[str, str] = {}
        after: str | None = ""
        while after is not None:
            page = await self.kv_page(prefix, after)
            items.update(page.items)
            after = page.next_after
        return items

    async def kv_page(self, prefix: str = "", after: str = "", count: int = KV_PAGE) -> KvItems:
        """One page of keys under `prefix`, past `after`, in key order."""
        return await self.call(api.KV_LIST, params={"prefix": prefix, "after": after, "count": count})

    # undelete records

    async def undelete(self, slices: list[UndeleteSlice], keep: float) -> float:
        """Take back every delete of these blobs stamped before now; when (clustermgr's clock) it took effect."""
        return (await self.call(api.UNDELETE_ADD, body=Undelete(slices=slices, keep=keep))).at

    async def undeleted(self, blobs: Sequence[tuple[int, int]]) -> list[float | None]:
        """When each blob (vid, bid; at most MAX_UNDELETE_LOOKS) was last undeleted (None: no record of it kept),
        read fresh from the leader."""
        return (await self.call(api.UNDELETE_GET, params=undelete_looks(blobs))).at

    # raft

    async def raft_status(self, host: str | None = None) -> ReplicaStatus:
        """The status of one replica (any host), or of the leader."""
        if host is not None:
            return await self.http.call_route(api.RAFT_STATUS, host.rstrip('/'))
        return await self.call(api.RAFT_STATUS)

    async def add_member(self, node_id: int, raft_addr: str, http_addr: str, learner: bool = True) -> RaftStatus:
        body = MemberAdd(node_id=node_id, raft_addr=raft_addr, http_addr=http_addr, learner=learner)
        return await self.call(api.RAFT_MEMBER_ADD, body=body)

    async def remove_member(self, node_id: int) -> RaftStatus:
        return await self.call(api.RAFT_MEMBER_REMOVE, body=MemberRemove(node_id=node_id))

    async def stat(self) -> ClusterStat:
        return await self.call(api.STAT)


async def keep_registered(cluster: ClusterClient, name: str, host: str, idc: str = "", ttl: float = 10.0) -> None:
    """Register a service and heartbeat it every ttl/3 until cancelled (re-registering if forgotten)."""
    registered = False
    while True:
        try:
            if not registered:
                await cluster.register_service(name, host, idc, ttl)
                registered = True
            else:
                await cluster.service_heartbeat(name, host)
        except NotFound:
            registered = False
            continue
        except Unavailable:
            pass
        await asyncio.sleep(ttl / 3)


class VolumeCache:
    """Volume info: in-process cache, then Redis (optional), then clustermgr.

    Entries expire after a TTL, and `invalidate` drops one at once. A blobnode answering that a unit moved
    (stale epoch, no such chunk, or no such disk on that host) means the cached volume is out of date: `on_unit`
    and `on_units` fetch it again from clustermgr (Redis is only a cache) and retry. While clustermgr does not
    answer, the call on the moved unit fails as its blobnode said, and the entry serves the volume's other units
    on: dropping it made every read and write of the volume wait out clustermgr's deadline and fail (a degraded
    read could not reach the parity its fallback needs). Serving it is safe for the reason `get` gives.
    """

    def __init__(self, cluster: ClusterClient, ttl: float, redis: Any = None, cluster_id: int = 0) -> None:
        self.cluster = cluster
        self.ttl = ttl
        self.redis = redis  # a redis.asyncio.Redis, or None; one may serve several clusters
        self._redis_errors = _redis_errors() if redis is not None else ()
        self._redis_prefix = f"blobstore:{cluster_id}:volume:"
        self._local: dict[int, tuple[float, VolumeInfo]] = {}

    def _key(self, vid: int) -> str:
        return f"{self._redis_prefix}{vid}"

    async def get(self, vid: int) -> VolumeInfo:
        """The volume, fetched again once its entry expired; while neither Redis nor clustermgr answers, the
        expired entry serves on (access keeps writing through an outage): a unit that moved meanwhile is
        refused by its blobnode (stale epoch), never written in the wrong place."""
        hit = self._local.get(vid)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        try:
            volume = await self._from_redis(vid) or await self.cluster.get_volume(
                vid, deadline=None if hit is None else STALE_ASK)
        except Unavailable:
            if hit is None:
                raise
            self._local[vid] = (time.monotonic() + STALE_RETRY, hit[1])  # not every PUT waits on clustermgr
            return hit[1]
        await self._to_redis(volume)
        self._local[vid] = (time.monotonic() + self.ttl, volume)
        return volume

    async def _from_redis(self, vid: int) -> VolumeInfo | None:
        if self.redis is None:
            return None
        try:
            raw = await self.redis.get(self._key(vid))
        except self._redis_errors as exc:  # a cache: without it, clustermgr answers
            log.warning("volume %d not read from the Redis cache: %s", vid, exc)
            return None
        return None if raw is None else VolumeInfo.model_validate_json(raw)

    async def _to_redis(self, volume: VolumeInfo) -> None:
        if self.redis is not None:
            with contextlib.suppress(*self._redis_errors):
                await self.redis.set(self._key(volume.vid), volume.model_dump_json(), ex=max(1, int(self.ttl)))

    async def invalidate(self, vid: int) -> None:
        self._local.pop(vid, None)
        if self.redis is not None:
            with contextlib.suppress(*self._redis_errors):
                await self.redis.delete(self._key(vid))

    async def _refetch(self, vid: int, moved: Exception) -> VolumeInfo:
        """The volume from clustermgr after a blobnode said one of its units moved (`moved`, raised again when
        clustermgr does not answer: the entry held stays for the other units)."""
        held = self._local.get(vid)
        try:
            volume = await self.cluster.get_volume(vid, deadline=None if held is None else STALE_ASK)
        except Unavailable:
            raise moved from None
        await self._to_redis(volume)
        self._local[vid] = (time.monotonic() + self.ttl, volume)
        return volume

    async def on_unit(self, vid: int, index: int, call: Callable[[Unit], Awaitable[T]]) -> T:
        """`call` on unit `index` of the volume; once more with the volume refetched if the unit moved."""
        try:
            return await call((await self.get(vid)).units[index])
        except MOVED_ERRORS as moved:
            return await call((await self._refetch(vid, moved)).units[index])

    async def on_units(self, vid: int, call: Callable[[Unit], Awaitable[object]]) -> None:
        """`call` on every unit of the volume at once; all of them again, with the volume refetched, if
        any unit moved. The other errors of the first failing call propagate."""
        try:
            await asyncio.gather(*(call(u) for u in (await self.get(vid)).units))
        except MOVED_ERRORS as moved:
            await asyncio.gather(*(call(u) for u in (await self._refetch(vid, moved)).units))
