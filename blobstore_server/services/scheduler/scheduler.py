"""The active scheduler: watches disks, keeps task records in clustermgr's kv, prepares destinations, hands
tasks to workers under leases and switches the volume's unit once a worker is done. Every decision is in
`rules.py`; this module reads, writes and calls.

Only the elected instance works; the task records (`task/<type>/<id>`) are loaded when it takes over, and
every change is written through before it is answered. Worker leases live in memory only; a takeover bumps the
lease epoch, so workers holding tasks of the old one are refused and acquire them again.

Fencing, besides clustermgr's check of the epoch on every change this instance asks of it: the chunk state
changes it sends to blobnodes carry the epoch too (each disk refuses an older one than it has seen), and on
taking over it seals again the source of every task past preparation, so a superseded instance that wakes up
cannot reopen one. Each hand-out of a task takes a new token, saved, then set as the destination chunk's task
fence before the worker hears of it; the fence is closed before the unit is switched to the destination, so a
worker that lost the task can discard nothing on the destination, live or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

from blobstore_server.libs.proto.cluster import WRITE_FENCED, DiskInfo, DiskStatus, VolumeInfo, VolumeStatus
from blobstore_server.libs.proto.clustermgr import Fence
from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.proto.scheduler import (
    BROKEN_AFTER_KEY,
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
    TaskState,
    WorkTask,
    parse_broken_after,
)
from blobstore_server.libs.proto.switches import Switches, TaskType, switch_states
from blobstore_server.libs.rpc.errors import Conflict, Fenced, NotFound, NotLeader, RpcError
from blobstore_server.services.blobnode.client import BlobnodeClient
from blobstore_server.services.clustermgr.client import ClusterClient
from blobstore_server.services.scheduler import rules
from blobstore_server.services.scheduler.config import SchedulerConfig
from blobstore_server.services.scheduler.election import Election
from blobstore_server.services.scheduler.inspect import VolumeInspector
from blobstore_server.services.scheduler.mirror import VolumeMirror
from blobstore_server.services.scheduler.rules import EVACUATE, LOCKING, Lease, advance

log = logging.getLogger(__name__)
UNREADABLE = frozenset({DiskStatus.BROKEN, DiskStatus.REPAIRING, DiskStatus.REPAIRED})
READONLY_TIMEOUT = 3.0  # s: making a source read-only is best effort; a round must not wait on one node


class Scheduler:
    def __init__(self, config: SchedulerConfig, cluster: ClusterClient, volumes: VolumeMirror,
                 blobnodes: BlobnodeClient, inspector: VolumeInspector, elections: ClusterClient) -> None:
        """`cluster` carries every state change, fenced with the epoch of the lease once won; `elections`
        (unfenced: a takeover must not be refused for the epoch it supersedes) only reads and swaps the record."""
        self.config, self.cluster, self.blobnodes, self.inspector = config, cluster, blobnodes, inspector
        self.volumes = volumes
        self.elections = elections
        self.me = config.advertised_host
        self.election = Election(self.me, config.election_ttl)
        self.epoch = 0  # of the lease this instance last won; its workers' task calls must carry it
        self.rounds = 0  # rounds completed while active: an operator (or a test) sees decisions being made
        self.fenced = 0  # requests refused for a superseded epoch: its own by clustermgr, workers' by it
        self.switches = Switches()
        self.tasks: dict[str, TaskRecord] = {}
        self.leases: dict[str, Lease] = {}
        self.held_back: dict[str, float] = {}  # task id -> monotonic time before which it is not handed out
        self.disks: dict[int, DiskInfo] = {}
        self.margins: dict[int, int] = {}  # vid -> losses it can still take, for volumes with a lost unit
        self.silent: dict[int, tuple[float, float]] = {}  # disk -> (last heartbeat seen, monotonic since)
        self.fenced_since: dict[int, float] = {}  # disk -> monotonic time it was first seen in a WRITE_FENCED status
        self.loaded = False
        self.mutex = asyncio.Lock()  # one change of the task table at a time (routes and rounds): `_changing`

    # leadership

    @property
    def active(self) -> bool:
        return self.election.active(time.monotonic())

    def require_active(self) -> None:
        if not self.active:
            leader = self.election.leader
            raise NotLeader(f"{self.me} is not the active scheduler", leader=leader or "")

    async def campaign(self) -> None:
        """Hold or watch the election record until cancelled."""
        while True:
            started = time.monotonic()
            try:
                raw = await self.elections.kv_get(LEADER_KEY)
                record = LeaderRecord.model_validate_json(raw) if raw else None
                claim = self.election.decide(record, started)
                if claim is not None:
                    expected = claim.expected.model_dump_json() if claim.expected else None
                    await self.elections.kv_cas(LEADER_KEY, expected, claim.record.model_dump_json())
                    if claim.record.epoch != self.epoch:
                        log.warning("%s is now the active scheduler (epoch %d)", self.me, claim.record.epoch)
                        self.epoch = claim.record.epoch
                        self.cluster.fence(Fence(key=LEADER_KEY, epoch=self.epoch))
                    self.election.won(claim, started)
            except Conflict:
                self.election.lost()
            except RpcError as exc:
                log.warning("election: %s", exc)
            if not self.active and self.loaded:
                self._forget()
            await asyncio.sleep(self.config.election_ttl / 3)

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """The task table's mutex, for one change (routes and rounds); a change clustermgr refuses as fenced
        makes this instance stand by."""
        async with self.mutex:
            try:
                yield
            except Fenced as exc:
                self._superseded(exc)
                raise

    def _superseded(self, exc: Fenced) -> None:
        """clustermgr refused a change: a newer scheduler holds the lease. Stand by at once, whatever the clock
        says (a pause or a partition outlasted the lease); counted once per lease lost."""
        if not self.loaded:
            return
        self.fenced += 1
        log.warning("%s was superseded (epoch %d): %s", self.me, self.epoch, exc)
        self.election.lost()
        self._forget()

    def _forget(self) -> None:
        """Standing by: another instance owns the tasks now."""
        log.warning("%s stands by", self.me)
        self.tasks.clear()
        self.leases.clear()
        self.held_back.clear()
        self.margins.clear()
        self.loaded = False

    # the round: disks, preparation, finishing

    async def run(self) -> None:
        while True:
            if self.active:
                try:
                    if not self.loaded:
                        await self._load()
                    await self._round()
                    self.rounds += 1
                except Fenced as exc:
                    self._superseded(exc)
                except RpcError as exc:
                    log.warning("scheduler round: %s", exc)
            await asyncio.sleep(self.config.round_interval)

    async def _load(self) -> None:
        records = await self.cluster.kv_list(TASK_PREFIX)
        self.tasks = {}
        for key, raw in records.items():
            try:
                task = TaskRecord.model_validate_json(raw)
            except ValueError:
                log.error("unreadable task record %s", key)
                continue
            self.tasks[task.task_id] = task
        # The sources this instance relies on staying sealed learn its epoch before it hands any task out: a
        # superseded instance can no longer reopen them.
        self.disks = {d.disk_id: d for d in await self.cluster.list_disks()}
        sealed = [t for t in self.tasks.values() if t.state in (TaskState.PREPARED, TaskState.WORK_COMPLETED)]
        await asyncio.gather(*(self._seal_source(task, readonly=True) for task in sealed))
        self.loaded = True
        log.info("loaded %d task records (%d open)", len(self.tasks), sum(t.open for t in self.tasks.values()))

    async def _round(self) -> None:
        config = await self.cluster.list_config()
        self.switches.update(switch_states(config))
        try:
            broken_after = parse_broken_after(config.get(BROKEN_AFTER_KEY))
        except ValueError as exc:
            log.warning("ignoring config: %s", exc)
            broken_after = None
        disks = await self.cluster.list_disks()
        volumes = await self.volumes.refresh()
        self.disks = {d.disk_id: d for d in disks}
        mono = time.monotonic()
        for disk in disks:
            if disk.status in WRITE_FENCED:
                self.fenced_since.setdefault(disk.disk_id, mono)
            else:
                self.fenced_since.pop(disk.disk_id, None)
        lost = {d.disk_id for d in disks
                if d.status in UNREADABLE or self._silent_for(d, mono) > self.config.disk_lost_after}
        self.margins = rules.volume_margins(volumes.values(), lost)
        placed = rules.units_by_disk(volumes.values())
        async with self._changing():
            await self._watch_disks(disks, placed, broken_after)
            if self.switches.is_on(TaskType.BALANCE):
                usable = [d for d in disks if d.alive and d.writable]
                task = rules.plan_balance(usable, placed, self.tasks.values(), time.time(),
                                          self.config.balance_threshold, self.config.balance_per_hour)
                if task is not None:
                    await self._create(task)
            await self._give_back_paused()
            await self._prepare(volumes)
            for task in [t for t in self.tasks.values() if t.state is TaskState.WORK_COMPLETED]:
                await self._finish(task)
            await self._prune()

    async def inspect(self) -> None:
        """Volume inspection passes while active and switched on, until cancelled."""
        while True:
            await asyncio.sleep(self.config.inspect_interval)
            if self.active and self.loaded and self.switches.is_on(TaskType.VOLUME_INSPECT):
                try:
                    await self.inspector.one_pass({t.vid for t in self.tasks.values() if t.open})
                except RpcError as exc:
                    log.warning("volume inspection: %s", exc)

    def _heard_from(self, disk_id: int) -> bool:
        """Whether the disk's node beat within `disk_lost_after`, as this scheduler saw it: worth a call."""
        disk = self.disks.get(disk_id)
        return disk is not None and self._silent_for(disk, time.monotonic()) <= self.config.disk_lost_after

    def _silent_for(self, disk: DiskInfo, now: float) -> float:
        """How long this scheduler has seen the disk's last heartbeat unchanged: silence is measured by the
        one watching, so a scheduler started after a whole-cluster outage gives every node time to beat."""
        seen = self.silent.get(disk.disk_id)
        if seen is None or seen[0] != disk.last_heartbeat:
            self.silent[disk.disk_id] = seen = (disk.last_heartbeat, now)
        return now - seen[1]

    async def _watch_disks(self, disks: Iterable[DiskInfo], placed: Mapping[int, Sequence[rules.Placed]],
                           broken_after: float | None) -> None:
        now, mono = time.time(), time.monotonic()
        for disk in disks:
            units = placed.get(disk.disk_id, [])
            evacuate = EVACUATE.get(disk.status)
            if evacuate is not None and self.switches.is_on(evacuate):
                for task in rules.units_to_evacuate(disk, units, self.tasks, now):
                    await self._create(task)
            units_left = len(units)
            open_tasks = sum(t.open and t.disk_id == disk.disk_id and t.task_type is evacuate
                             for t in self.tasks.values())
            status = rules.next_disk_status(disk, self._silent_for(disk, mono), broken_after, units_left, open_tasks)
            if status is not None:
                log.warning("disk %d (%s): %s -> %s (%d units, %d open tasks)", disk.disk_id, disk.host,
                            disk.status, status, units_left, open_tasks)
                await self.cluster.set_disk(disk.disk_id, status=status)

    async def _give_back_paused(self) -> None:
        """Paused tasks in the way of a disk repair release their volume (`rules.to_give_back`)."""
        states = {task_type: self.switches.is_on(task_type) for task_type in TaskType}
        for task in rules.to_give_back(self.tasks.values(), states, self.leases, time.monotonic()):
            assert task.destination is not None  # prepared
            self.leases.pop(task.task_id, None)
            await self._release(task.destination.host, task.destination.disk_id, task.destination.vuid)
            await self._unlock(task)
            await self._seal_source(task, readonly=False)  # the volume takes writes again: its unit there too
            await self._save(advance(task, TaskState.INITED, time.time(), destination=None,
                                     reason=f"{task.task_type} is switched off: gave volume {task.vid} to its repair"))
            log.warning("task %s paused and given back: volume %d has a disk repair waiting", task.task_id, task.vid)

    async def _prepare(self, volumes: Mapping[int, VolumeInfo]) -> None:
        busy = sum(t.state in (TaskState.PREPARED, TaskState.WORK_COMPLETED) for t in self.tasks.values())
        states = {task_type: self.switches.is_on(task_type) for task_type in TaskType}
        mono = time.monotonic()
        waiting = [t for t in self.tasks.values() if self.held_back.get(t.task_id, 0.0) <= mono]
        for task in rules.to_prepare(waiting, states, self.config.max_prepared - busy, self.margins):
            volume = volumes.get(task.vid)
            if volume is None:
                await self._save(advance(task, TaskState.FINISHED_IN_ADVANCE, time.time(), reason="volume gone"))
                continue
            await self._prepare_one(task, volume)

    async def _prepare_one(self, task: TaskRecord, volume: VolumeInfo) -> None:
        """Lock the volume if the task copies, reserve a new unit (epoch + 1) on a disk not tried before and
        create its chunk; a failure is retried in a later round on another disk."""
        now = time.time()
        if volume.units[task.unit_index].vuid != task.source_vuid:
            await self._save(advance(task, TaskState.FINISHED_IN_ADVANCE, now, reason="the unit moved already"))
            return
        try:
            if task.task_type in LOCKING and volume.status is not VolumeStatus.LOCK:
                await self.cluster.lock_volume(task.vid)
            # Whatever the task, no blob may land on the old unit after the worker listed the units (the access
            # node owes each refused shard a repair, which lands on the new unit): the source chunk is sealed, or
            # its node's write fence is waited out (a node cut off from clustermgr that access still reaches).
            sealed = await self._seal_source(task, readonly=True)
            if not self._source_fenced(task.disk_id, sealed):
                self._hold_back(task, f"the source on disk {task.disk_id} was not sealed and its node may still "
                                      "take writes: waiting out its write fence")
                return
            destination = await self.cluster.alloc_unit(task.vid, task.unit_index, disk_id=task.target_disk,
                                                        avoid=[task.disk_id, *task.avoid_disks])
        except Fenced:
            raise
        except RpcError as exc:
            self._hold_back(task, f"cannot reserve a destination: {exc}")
            return
        try:
            await self.blobnodes.create_chunk(destination.host, destination.disk_id, destination.vuid,
                                              scheduler_epoch=self.epoch)
        except Fenced:
            raise
        except RpcError as exc:
            self._hold_back(task, f"cannot create the chunk on disk {destination.disk_id}: {exc}")
            if task.target_disk is None:
                await self._save(task.model_copy(update={"avoid_disks": [*task.avoid_disks, destination.disk_id]}))
            return
        await self._save(advance(task, TaskState.PREPARED, now, destination=destination, reason=""))
        log.info("task %s prepared: volume %d unit %d disk %d -> %d", task.task_id, task.vid, task.unit_index,
                 task.disk_id, destination.disk_id)

    async def _seal_source(self, task: TaskRecord, readonly: bool) -> bool:
        """Best effort: the task's source chunk read-only (or writable again), if its node beat lately; whether it
        is (a chunk or disk the node does not have takes no write either). A disk that has seen a newer scheduler
        epoch refuses it (Fenced: superseded)."""
        if not self._heard_from(task.disk_id):
            return False
        try:
            await self.blobnodes.set_chunk_readonly(task.source_host, task.disk_id, task.source_vuid, readonly,
                                                    timeout=READONLY_TIMEOUT, scheduler_epoch=self.epoch)
        except Fenced:
            raise
        except NotFound:
            return True
        except RpcError as exc:
            log.info("chunk %d on disk %d not made %s: %s", task.source_vuid, task.disk_id,
                     "read-only" if readonly else "writable", exc)
            return False
        return True

    def _source_fenced(self, disk_id: int, sealed: bool) -> bool:
        """`rules.source_fenced`, from what this scheduler saw (a disk clustermgr no longer knows gets no answers)."""
        disk = self.disks.get(disk_id)
        if disk is None:
            return True
        mono = time.monotonic()
        return rules.source_fenced(disk, sealed, self._silent_for(disk, mono),
                                   mono - self.fenced_since.get(disk_id, mono))

    def _hold_back(self, task: TaskRecord, reason: str) -> None:
        log.warning("task %s: %s", task.task_id, reason)
        self.held_back[task.task_id] = time.monotonic() + max(self.config.cancel_hold, self.config.round_interval)

    async def _finish(self, task: TaskRecord) -> None:
        """Close the destination's task fence, switch the volume's unit to it, release the old chunk, unlock;
        FINISHED. A refused switch (the reservation was superseded) sends the task back to be prepared again; a
        fence that cannot be closed holds the switch for a later round (or, the destination gone, redoes the task)."""
        assert task.destination is not None
        destination, now = task.destination, time.time()
        volume = await self.cluster.get_volume(task.vid)
        current = volume.units[task.unit_index]
        if current.vuid == task.source_vuid:
            if not await self._fence_destination(task, None):
                return
            try:
                await self.cluster.update_unit(task.vid, task.unit_index, destination.vuid, destination.disk_id)
            except Fenced:
                raise  # superseded: the destination may be the live unit by now; a newer scheduler decides
            except Conflict as exc:
                await self._release(destination.host, destination.disk_id, destination.vuid)
                await self._save(advance(task, TaskState.INITED, now, destination=None, redo=task.redo + 1,
                                         reason=f"switch refused: {exc}"))
                return
        elif current.vuid != destination.vuid:
            await self._release(destination.host, destination.disk_id, destination.vuid)
            await self._unlock(task)
            await self._save(advance(task, TaskState.FINISHED_IN_ADVANCE, now, reason="the unit moved meanwhile"))
            return
        await self._release(task.source_host, task.disk_id, task.source_vuid)
        await self._unlock(task)
        await self._save(advance(task, TaskState.FINISHED, now))
        log.info("task %s finished: volume %d unit %d now %d on disk %d", task.task_id, task.vid, task.unit_index,
                 destination.vuid, destination.disk_id)

    async def _fence_destination(self, task: TaskRecord, token: int | None) -> bool:
        """Open the task fence of the task's destination chunk at `token` (a hand-out), or close it (None: before the
        switch to it); False if the blobnode could not, and the task (saved) is held back for a while, or redone on
        another disk when the destination is gone (`rules.gives_up_destination`)."""
        assert task.destination is not None
        destination = task.destination
        try:
            await self.blobnodes.set_task_fence(destination.host, destination.disk_id, destination.vuid, self.epoch,
                                                token, timeout=READONLY_TIMEOUT)
        except Fenced:
            raise
        except RpcError as exc:
            what = f"cannot {'open' if token else 'close'} the task fence on disk {destination.disk_id}: {exc}"
            if rules.gives_up_destination(exc, self._heard_from(destination.disk_id)):
                await self._save(await self._redo_elsewhere(task, what))
            else:
                self._hold_back(task, what)
            return False
        return True

    async def _redo_elsewhere(self, task: TaskRecord, reason: str) -> TaskRecord:
        """The task back to inited after its destination failed: that chunk released, its disk never tried again
        (unless an operator chose it)."""
        assert task.destination is not None
        await self._release(task.destination.host, task.destination.disk_id, task.destination.vuid)
        avoid = task.avoid_disks if task.target_disk else [*task.avoid_disks, task.destination.disk_id]
        return advance(task, TaskState.INITED, time.time(), destination=None, avoid_disks=avoid, redo=task.redo + 1,
                       reason=reason)

    async def _release(self, host: str, disk_id: int, vuid: int) -> None:
        """Best effort: a chunk on a dead disk goes with the disk. clustermgr first confirms, in the log's order
        and under this scheduler's fence, that the unit is no volume's live unit."""
        try:
            await self.cluster.release_unit(Vuid(vuid).vid(), vuid)
            await self.blobnodes.release_chunk(host, disk_id, vuid, scheduler_epoch=self.epoch)
        except Fenced:
            raise  # superseded: stand by (see `_changing`), release nothing
        except RpcError as exc:
            log.info("chunk %d on disk %d not released: %s", vuid, disk_id, exc)

    async def _unlock(self, task: TaskRecord) -> None:
        if task.task_type not in LOCKING:
            return
        try:
            await self.cluster.unlock_volume(task.vid)
        except Fenced:
            raise
        except Conflict as exc:  # not locked (any more), or another move pending
            log.info("volume %d stays as it is: %s", task.vid, exc)

    async def _prune(self) -> None:
        now = time.time()
        for task in [t for t in self.tasks.values() if rules.prunable(t, now, self.config.keep_finished)]:
            with contextlib.suppress(NotFound):
                await self.cluster.kv_delete(task.key)
            del self.tasks[task.task_id]

    async def _create(self, task: TaskRecord) -> None:
        try:
            await self.cluster.kv_cas(task.key, None, task.model_dump_json())
        except Conflict:  # written by an earlier holder that did not get to load it: read it back
            raw = await self.cluster.kv_get(task.key)
            if raw is None:
                return
            task = TaskRecord.model_validate_json(raw)
        else:
            log.info("task %s created: volume %d unit %d on disk %d", task.task_id, task.vid, task.unit_index,
                     task.disk_id)
        self.tasks[task.task_id] = task

    async def _save(self, task: TaskRecord) -> None:
        await self.cluster.kv_set(task.key, task.model_dump_json())
        self.tasks[task.task_id] = task
        if not task.open or task.state is TaskState.INITED:
            self.leases.pop(task.task_id, None)

    # the worker protocol

    async def acquire(self, req: AcquireRequest) -> AcquireResult:
        """Hand the next task out under a new token: saved first, then set as its destination's task fence (the
        task is not handed out if the fence cannot be), then leased to the worker."""
        self.require_active()
        async with self._changing():
            states = {task_type: self.switches.is_on(task_type) for task_type in TaskType}
            task = rules.to_hand_out(self.tasks.values(), self.leases, self.held_back, states, req.task_types,
                                     time.monotonic(), self.margins, req.urgent_only)
            if task is None or task.destination is None:
                return AcquireResult()
            destination = task.destination
            task = task.model_copy(update={"worker": req.worker, "token": task.token + 1, "mtime": time.time()})
            await self._save(task)
            if not await self._fence_destination(task, task.token):
                return AcquireResult()
            self.leases[task.task_id] = Lease(req.worker, time.monotonic() + self.config.task_lease_ttl)
        source_disk = self.disks.get(task.disk_id)
        readable = source_disk is not None and source_disk.status not in UNREADABLE
        ref = TaskRef(task_type=task.task_type, task_id=task.task_id, worker=req.worker,
                      source_vuid=task.source_vuid, destination_vuid=destination.vuid, epoch=self.epoch,
                      token=task.token)
        log.info("task %s handed to %s", task.task_id, req.worker)
        return AcquireResult(task=WorkTask(ref=ref, vid=task.vid, unit_index=task.unit_index, source=task.source,
                                           destination=destination, source_readable=readable,
                                           urgent=rules.is_urgent(task, self.margins),
                                           lease_ttl=self.config.task_lease_ttl, done_bytes=task.done_bytes,
                                           done_shards=task.done_shards))

    def _fenced(self, ref: TaskRef) -> TaskRecord:
        """The task `ref` names, with its lease renewed, or Conflict why not (Fenced: handed out under an
        older epoch, by a scheduler that has been superseded since)."""
        self.require_active()
        if ref.epoch != self.epoch:
            self.fenced += 1
            log.warning("fenced %s's call about task %s: epoch %d, not %d", ref.worker, ref.task_id, ref.epoch,
                        self.epoch)
            raise Fenced(f"task {ref.task_id} was handed out under epoch {ref.epoch}; the lease is at {self.epoch}")
        task = self.tasks.get(ref.task_id)
        mono = time.monotonic()
        why = rules.fence(task, ref, self.leases.get(ref.task_id), mono)
        if why is not None:
            raise Conflict(why)
        assert task is not None
        if not self.switches.is_on(task.task_type):
            raise Conflict(f"{task.task_type} is switched off: task paused")
        self.leases[ref.task_id] = Lease(ref.worker, mono + self.config.task_lease_ttl)
        return task

    async def renew(self, ref: TaskRef) -> TaskAck:
        task = self._fenced(ref)
        return TaskAck(task_id=task.task_id, state=task.state)

    async def report(self, progress: TaskProgress) -> TaskAck:
        async with self._changing():
            task = self._fenced(progress.ref)
            task = task.model_copy(update={**progress.model_dump(exclude={"ref"}), "mtime": time.time()})
            await self._save(task)
        return TaskAck(task_id=task.task_id, state=task.state)

    async def complete(self, ref: TaskRef) -> TaskAck:
        async with self._changing():
            task = self._fenced(ref)
            task = advance(task, TaskState.WORK_COMPLETED, time.time())
            await self._save(task)
            self.leases.pop(task.task_id, None)
            try:
                await self._finish(task)
            except Fenced:
                raise
            except RpcError as exc:  # the next round finishes it
                log.warning("task %s: finishing later: %s", task.task_id, exc)
            task = self.tasks[task.task_id]
        return TaskAck(task_id=task.task_id, state=task.state)

    async def cancel(self, req: TaskCancel) -> TaskAck:
        async with self._changing():
            task = self._fenced(req.ref)
            self.leases.pop(task.task_id, None)
            now = time.time()
            volume = await self.cluster.get_volume(task.vid)
            if volume.units[task.unit_index].vuid != task.source_vuid:
                task = advance(task, TaskState.FINISHED_IN_ADVANCE, now, reason=f"the unit moved: {req.reason}")
            elif req.destination_failed and task.destination is not None:
                task = await self._redo_elsewhere(task, req.reason)
            else:
                self.held_back[task.task_id] = time.monotonic() + self.config.cancel_hold
                task = task.model_copy(update={"reason": req.reason, "mtime": now})
            if not task.open:
                await self._unlock(task)
            await self._save(task)
            log.warning("task %s cancelled by %s: %s -> %s", task.task_id, req.ref.worker, req.reason, task.state)
        return TaskAck(task_id=task.task_id, state=task.state)

    async def manual_migrate(self, req: ManualMigrate) -> TaskRecord:
        self.require_active()
        volume = await self.cluster.get_volume(req.vid)
        if req.index >= len(volume.units):
            raise Conflict(f"volume {req.vid} has {len(volume.units)} units, no unit {req.index}")
        if req.disk_id is not None and any(u.disk_id == req.disk_id for u in volume.units):
            raise Conflict(f"disk {req.disk_id} already holds a unit of volume {req.vid}")
        task = rules.new_task(TaskType.MANUAL_MIGRATE, volume, req.index, time.time())
        async with self._changing():
            existing = self.tasks.get(task.task_id)
            if existing is not None and existing.open:
                raise Conflict(f"task {task.task_id} already moves that unit ({existing.state})")
            task = task.model_copy(update={"target_disk": req.disk_id})
            await self._save(task)
        return task

    def status(self) -> SchedulerStatus:
        mono = time.monotonic()
        return SchedulerStatus(host=self.me, active=self.active, leader=self.election.leader,
                               open_tasks=sum(t.open for t in self.tasks.values()),
                               leased_tasks=sum(lease.expires > mono for lease in self.leases.values()))
