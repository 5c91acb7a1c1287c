"""Background task types and their on/off switches (CubeFS's names), kept in clustermgr's config.

A switch lives under the config key `switch/<task type>` with the value "on" or "off"; a key never set
means on. Whoever does the work reads the switches every few seconds (`Switches.follow`) and pauses
while its switch is off: tinker for shard_repair and blob_delete, the scheduler for the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum

log = logging.getLogger(__name__)

SWITCH_PREFIX = "switch/"
ON, OFF = "on", "off"


class TaskType(StrEnum):
    """Every kind of background work; each has a switch of the same name."""

    DISK_REPAIR = "disk_repair"
    DISK_DROP = "disk_drop"
    BALANCE = "balance"
    MANUAL_MIGRATE = "manual_migrate"
    VOLUME_INSPECT = "volume_inspect"
    SHARD_REPAIR = "shard_repair"
    BLOB_DELETE = "blob_delete"


def switch_key(task: TaskType) -> str:
    return f"{SWITCH_PREFIX}{task}"


def parse_switch(key: str, value: str) -> tuple[TaskType, bool]:
    """The task and its state from one config entry; ValueError naming what is wrong."""
    name = key.removeprefix(SWITCH_PREFIX)
    try:
        task = TaskType(name)
    except ValueError:
        raise ValueError(f"{key!r}: no task type {name!r} (one of {', '.join(TaskType)})") from None
    if value not in (ON, OFF):
        raise ValueError(f"{key!r} must be {ON!r} or {OFF!r}, not {value!r}")
    return task, value == ON


def switch_states(config: Mapping[str, str]) -> dict[TaskType, bool]:
    """Every switch from a config listing: unset keys are on; a malformed entry is skipped (stays on)."""
    states = dict.fromkeys(TaskType, True)
    for key, value in config.items():
        if key.startswith(SWITCH_PREFIX):
            try:
                task, on = parse_switch(key, value)
            except ValueError as exc:
                log.warning("ignoring config %s", exc)
                continue
            states[task] = on
    return states


class Switches:
    """The switches as last read; `wait_on` lets work wait while its switch is off."""

    def __init__(self) -> None:
        self._on = {task: asyncio.Event() for task in TaskType}
        for event in self._on.values():
            event.set()

    def is_on(self, task: TaskType) -> bool:
        return self._on[task].is_set()

    async def wait_on(self, task: TaskType) -> None:
        await self._on[task].wait()

    def update(self, states: Mapping[TaskType, bool]) -> None:
        for task, on in states.items():
            if on != self.is_on(task):
                log.warning("switch %s is now %s", task, ON if on else OFF)
            (self._on[task].set if on else self._on[task].clear)()

    async def follow(self, read_config: Callable[[], Awaitable[Mapping[str, str]]], interval: float) -> None:
        """Re-read the config every `interval` seconds until cancelled; an unreachable clustermgr keeps the
        last known states (work neither starts nor stops because of it)."""
        while True:
            try:
                self.update(switch_states(await read_config()))
            except Exception as exc:  # the config source's own errors: try again next round
                log.warning("cannot read the task switches: %s", exc)
            await asyncio.sleep(interval)
