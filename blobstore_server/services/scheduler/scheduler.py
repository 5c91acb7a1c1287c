"""The active scheduler's I/O: it reads clustermgr, answers the worker protocol and carries out what its state
machine (`state.SchedulerState`, where every decision is made) answers each event, feeding back the outcome of
each action. It watches disks, keeps task records in clustermgr's kv, prepares destinations, hands tasks to
workers under leases and switches the volume's unit once a worker is done; `state.py` says how it is fenced.

One change of the task table at a time: a round and the worker calls that change the table each hold the mutex
while their actions are carried out (`_changing`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable

from blobstore_server.libs.proto.cluster import Unit
from blobstore_server.libs.proto.clustermgr import Fence
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import (
    LEADER_KEY,
    TASK_PREFIX,
    AcquireRequest,
    AcquireResult,
    LeaderRecord,
    ManualMigrate,
    SchedulerStatus,
    TaskAck,
    TaskCancel,
    TaskProgress,
    TaskRecord,
    TaskRef,
    WorkTask,
)
from blobstore_server.libs.proto.switches import TaskType
from blobstore_server.libs.rpc.errors import Conflict, Fenced, NotFound, RpcError
from blobstore_server.libs.rpc.tickets import Kind
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.events import (
    Action,
    AllocUnit,
    CampaignPassed,
    ChunkCreated,
    ClaimLease,
    ClusterSeen,
    ConfigSeen,
    CreateChunk,
    CreateTask,
    DeleteTask,
    Event,
    FenceSet,
    FenceWith,
    Instant,
    LeaderSeen,
    LeaseGranted,
    LeaseLost,
    LockVolume,
    MigrateAsked,
    PersistTask,
    ReadUnit,
    ReleaseChunk,
    SealResult,
    SealSource,
    SetDiskStatus,
    SetSourcesReadonly,
    SetTaskFence,
    StaleEpoch,
    Superseded,
    SwitchUnit,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskDeleted,
    TaskPersisted,
    TaskReported,
    TasksLoaded,
    Tick,
    UnitAllocated,
    UnitSeen,
    UnitSwitched,
    UnlockVolume,
    VolumeLocked,
    WorkerAcquire,
    WorkerHeartbeat,
    drive,
)
from blobstore_server.services.scheduler.inspect import VolumeInspector
from blobstore_server.services.scheduler.mirror import VolumeMirror
from blobstore_server.services.scheduler.state import SchedulerState

log = logging.getLogger(__name__)
READONLY_TIMEOUT = 3.0  # s: making a source read-only is best effort; a round must not wait on one node


def _at() -> Instant:
    return Instant(time.time(), time.monotonic())


async def _outcome(call: Awaitable[object]) -> RpcError | None:
    """How a call went: None, or the error it failed with. Fenced is raised: this instance was superseded."""
    try:
        await call
    except Fenced:
        raise
    except RpcError as exc:
        return exc
    return None


class Scheduler:
    def __init__(self, config: SchedulerConfig, cluster: ClusterClient, volumes: VolumeMirror,
                 blobnodes: BlobnodeClient, inspector: VolumeInspector, elections: ClusterClient) -> None:
        """`cluster` carries every state change, fenced with the epoch of the lease once won; `elections`
        (unfenced: a takeover must not be refused for the epoch it supersedes) only reads and swaps the record."""
        self.config, self.cluster, self.blobnodes, self.inspector = config, cluster, blobnodes, inspector
        self.volumes = volumes
        self.elections = elections
        self.state = SchedulerState(config)
        # discard tickets (libs/rpc/tickets.py): none without auth, where blobnodes take discards without them
        self.tickets = config.auth.minter(Kind.DISCARD) if config.auth else None
        self._epoch_ticket: tuple[int, str | None] = (0, None)  # clustermgr's ticket for the lease epoch: `_lease`
        self.rounds = 0  # rounds completed while active: an operator (or a test) sees decisions being made
        self.mutex = asyncio.Lock()  # one change of the task table at a time (routes and rounds): `_changing`

    # leadership

    async def _lease(self) -> tuple[int, str | None]:
        """What a chunk change names of this scheduler's lease: its epoch and clustermgr's ticket for it (asked once
        an epoch; Fenced once superseded), which blobnodes with auth require."""
        epoch = self.state.epoch
        if self._epoch_ticket[0] != epoch:
            self._epoch_ticket = (epoch, await self.cluster.epoch_ticket(epoch))
        return self._epoch_ticket

    @property
    def active(self) -> bool:
        return self.state.active(time.monotonic())

    def require_active(self) -> None:
        refusal = self.state.standby_refusal(time.monotonic())
        if refusal is not None:
            raise refusal

    async def campaign(self) -> None:
        """Hold or watch the election record until cancelled."""
        while True:
            started = _at()
            try:
                raw = await self.elections.kv_get(LEADER_KEY)
                record = LeaderRecord.model_validate_json(raw) if raw else None
                await self._drive(LeaderSeen(record=record, at=started))
            except RpcError as exc:
                log.warning("election: %s", exc)
            await self._drive(CampaignPassed(at=_at()))
            await asyncio.sleep(self.config.election_ttl / 3)

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """The task table's mutex, for one change (routes and rounds); a change clustermgr refuses as fenced
        makes this instance stand by."""
        async with self.mutex:
            try:
                yield
            except StaleEpoch:
                raise  # the caller's epoch is old, not ours
            except Fenced as exc:
                await self._drive(Superseded(reason=str(exc), at=_at()))
                raise

    # the round

    async def run(self) -> None:
        while True:
            if self.active:
                try:
                    if not self.state.loaded:
                        await self._load()
                    await self._round()
                    self.rounds += 1
                except Fenced as exc:
                    await self._drive(Superseded(reason=str(exc), at=_at()))
                except RpcError as exc:
                    log.warning("scheduler round: %s", exc)
            await asyncio.sleep(self.config.round_interval)

    async def _load(self) -> None:
        records = await self.cluster.kv_list(TASK_PREFIX)
        tasks = []
        for key, raw in records.items():
            try:
                tasks.append(TaskRecord.model_validate_json(raw))
            except ValueError:
                log.error("unreadable task record %s", key)
        disks = await self.cluster.list_disks()
        await self._drive(TasksLoaded(tasks=tasks, disks=disks, at=_at()))

    async def _round(self) -> None:
        await self._drive(ConfigSeen(config=await self.cluster.list_config(), at=_at()))
        disks = await self.cluster.list_disks()
        volumes = await self.volumes.refresh()
        await self._drive(ClusterSeen(disks=disks, volumes=volumes, at=_at()))
        async with self._changing():
            await self._drive(Tick(at=_at()))

    async def inspect(self) -> None:
        """Volume inspection passes while active and switched on, until cancelled."""
        while True:
            await asyncio.sleep(self.config.inspect_interval)
            if self.active and self.state.loaded and self.state.switches.is_on(TaskType.VOLUME_INSPECT):
                try:
                    await self.inspector.one_pass({t.vid for t in self.state.tasks.values() if t.open})
                except RpcError as exc:
                    log.warning("volume inspection: %s", exc)

    # carrying out

    async def _drive(self, event: Event) -> AcquireResult | TaskRecord | None:
        """Carry out what the state answers `event` (`events.drive`): the route's answer, if any."""
        return await drive(self.state.handle, event, self._perform, _at)

    async def _perform(self, action: Action) -> Event | None:
        """Make the call `action` asks for: the event its outcome is, if the state waits for one."""
        match action:
            case ClaimLease():
                return await self._claim(action)
            case FenceWith():
                self.cluster.fence(Fence(key=LEADER_KEY, epoch=action.epoch))
            case CreateTask() | PersistTask() | DeleteTask():
                return await self._write(action)
            case SetDiskStatus():
                await self.cluster.set_disk(action.disk_id, status=action.status)
            case LockVolume():
                return VolumeLocked(task=action.task, error=await _outcome(self.cluster.lock_volume(action.task.vid)),
                                    at=_at())
            case SealSource():
                return SealResult(task=action.task, sealed=await self._set_readonly(action.task, True), at=_at())
            case SetSourcesReadonly():
                await asyncio.gather(*(self._set_readonly(task, action.readonly) for task in action.tasks))
            case AllocUnit():
                return await self._alloc(action)
            case CreateChunk():
                return ChunkCreated(task=action.task, destination=action.destination,
                                    error=await _outcome(self._create_chunk(action.destination)), at=_at())
            case SetTaskFence():
                return FenceSet(task=action.task, token=action.token, error=await self._set_task_fence(action),
                                at=_at())
            case ReadUnit():
                volume = await self.cluster.get_volume(action.task.vid)
                return UnitSeen(task=action.task, vuid=volume.units[action.task.unit_index].vuid,
                                cancel=action.cancel, at=_at())
            case SwitchUnit():
                return await self._switch(action)
            case ReleaseChunk():
                await self._release(action)
            case UnlockVolume():
                await self._unlock(action.vid)
            case _:
                raise TypeError(f"cannot carry out {action!r}")
        return None

    async def _claim(self, action: ClaimLease) -> Event:
        claim = action.claim
        expected = claim.expected.model_dump_json() if claim.expected else None
        try:
            await self.elections.kv_cas(LEADER_KEY, expected, claim.record.model_dump_json())
        except Conflict:
            return LeaseLost(at=_at())
        return LeaseGranted(claim=claim, started=action.started, at=_at())

    async def _write(self, action: CreateTask | PersistTask | DeleteTask) -> Event | None:
        """A task record written through: created (unless an earlier holder did, then read back), saved, deleted."""
        task = action.task
        match action:
            case PersistTask():
                await self.cluster.kv_set(task.key, task.model_dump_json())
                return TaskPersisted(task=task, at=_at())
            case DeleteTask():
                with contextlib.suppress(NotFound):
                    await self.cluster.kv_delete(task.key)
                return TaskDeleted(task_id=task.task_id, at=_at())
        try:
            await self.cluster.kv_cas(task.key, None, task.model_dump_json())
        except Conflict:  # written by an earlier holder that did not get to load it: read it back
            raw = await self.cluster.kv_get(task.key)
            if raw is None:
                return None
            task = TaskRecord.model_validate_json(raw)
        else:
            log.info("task %s created: volume %d unit %d on disk %d", task.task_id, task.vid, task.unit_index,
                     task.disk_id)
        return TaskCreated(task=task, at=_at())

    async def _set_readonly(self, task: TaskRecord, readonly: bool) -> bool:
        """Best effort: the task's source chunk read-only (or writable again); whether it is (a chunk or disk the
        node does not have takes no write either). A disk that has seen a newer scheduler epoch refuses it
        (Fenced: superseded)."""
        try:
            epoch, ticket = await self._lease()
            await self.blobnodes.set_chunk_readonly(task.source_host, task.disk_id, task.source_vuid, readonly,
                                                    timeout=READONLY_TIMEOUT, scheduler_epoch=epoch,
                                                    epoch_ticket=ticket)
        except Fenced:
            raise
        except NotFound:
            return True
        except RpcError as exc:
            log.info("chunk %d on disk %d not made %s: %s", task.source_vuid, task.disk_id,
                     "read-only" if readonly else "writable", exc)
            return False
        return True

    async def _alloc(self, action: AllocUnit) -> Event:
        task = action.task
        try:
            destination = await self.cluster.alloc_unit(task.vid, task.unit_index, disk_id=task.target_disk,
                                                        avoid=[task.disk_id, *task.avoid_disks])
        except Fenced:
            raise
        except RpcError as exc:
            return UnitAllocated(task=task, destination=None, error=exc, at=_at())
        return UnitAllocated(task=task, destination=destination, error=None, at=_at())

    async def _create_chunk(self, destination: Unit) -> None:
        epoch, ticket = await self._lease()
        await self.blobnodes.create_chunk(destination.host, destination.disk_id, destination.vuid,
                                          scheduler_epoch=epoch, epoch_ticket=ticket)

    async def _set_task_fence(self, action: SetTaskFence) -> RpcError | None:
        assert action.task.destination is not None
        return await _outcome(self._fence_destination(action.task.destination, action.token))

    async def _fence_destination(self, destination: Unit, token: int | None) -> None:
        epoch, ticket = await self._lease()
        await self.blobnodes.set_task_fence(destination.host, destination.disk_id, destination.vuid, epoch, token,
                                            timeout=READONLY_TIMEOUT, epoch_ticket=ticket)

    async def _switch(self, action: SwitchUnit) -> Event:
        task = action.task
        assert task.destination is not None
        try:
            await self.cluster.update_unit(task.vid, task.unit_index, task.destination.vuid,
                                           task.destination.disk_id, lost=task.lost_bids)
        except Fenced:
            raise  # superseded: the destination may be the live unit by now; a newer scheduler decides
        except Conflict as exc:
            return UnitSwitched(task=task, refused=exc, at=_at())
        return UnitSwitched(task=task, refused=None, at=_at())

    async def _release(self, action: ReleaseChunk) -> None:
        """Best effort: a chunk on a dead disk goes with the disk. clustermgr first confirms, in the log's order
        and under this scheduler's fence, that the unit is no volume's live unit, and answers the release ticket
        the blobnode takes."""
        try:
            released = await self.cluster.release_unit(Vuid(action.vuid).vid(), action.vuid, action.disk_id)
            epoch, ticket = await self._lease()
            await self.blobnodes.release_chunk(action.host, action.disk_id, action.vuid, scheduler_epoch=epoch,
                                               ticket=released.ticket, epoch_ticket=ticket)
        except Fenced:
            raise  # superseded: stand by (see `_changing`), release nothing
        except RpcError as exc:
            log.info("chunk %d on disk %d not released: %s", action.vuid, action.disk_id, exc)

    async def _unlock(self, vid: int) -> None:
        try:
            await self.cluster.unlock_volume(vid)
        except Fenced:
            raise
        except Conflict as exc:  # not locked (any more), or another move pending
            log.info("volume %d stays as it is: %s", vid, exc)

    # the worker protocol

    async def acquire(self, req: AcquireRequest) -> AcquireResult:
        """Hand the next task out (`SchedulerState._acquire`), or none."""
        self.require_active()
        async with self._changing():
            answer = await self._drive(WorkerAcquire(request=req, at=_at()))
        if not isinstance(answer, AcquireResult) or answer.task is None:
            return AcquireResult()
        return AcquireResult(task=self._with_ticket(answer.task))

    def _with_ticket(self, task: WorkTask) -> WorkTask:
        """`task` with the discard ticket for its destination under this hand-out's token: the destination's task
        fence is open at that token only while the unit is filled, so the ticket destroys nothing live."""
        if self.tickets is None:
            return task
        dest = task.destination
        return task.model_copy(update={"discard_ticket": self.tickets.mint(dest.host, dest.disk_id, dest.vuid,
                                                                           task.ref.token)})

    def _ack(self, task_id: str) -> TaskAck:
        return TaskAck(task_id=task_id, state=self.state.tasks[task_id].state)

    async def renew(self, ref: TaskRef) -> TaskAck:
        await self._drive(WorkerHeartbeat(ref=ref, at=_at()))
        return self._ack(ref.task_id)

    async def report(self, progress: TaskProgress) -> TaskAck:
        async with self._changing():
            await self._drive(TaskReported(progress=progress, at=_at()))
            return self._ack(progress.ref.task_id)

    async def complete(self, ref: TaskRef) -> TaskAck:
        async with self._changing():
            await self._drive(TaskCompleted(ref=ref, at=_at()))
            return self._ack(ref.task_id)

    async def cancel(self, req: TaskCancel) -> TaskAck:
        async with self._changing():
            await self._drive(TaskCancelled(request=req, at=_at()))
            return self._ack(req.ref.task_id)

    async def manual_migrate(self, req: ManualMigrate) -> TaskRecord:
        self.require_active()
        volume = await self.cluster.get_volume(req.vid)
        async with self._changing():
            answer = await self._drive(MigrateAsked(request=req, volume=volume, at=_at()))
        assert isinstance(answer, TaskRecord)
        return answer

    def status(self) -> SchedulerStatus:
        return self.state.status(time.monotonic())
