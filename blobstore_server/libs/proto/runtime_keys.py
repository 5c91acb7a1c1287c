"""The keys of clustermgr's runtime config (`blobstore config set KEY VALUE`), each with how its value is read and
one line on what it does: clustermgr takes no other key and no value its parser refuses, and the CLI's help lists
them from here, so the keys accepted and the keys documented are the same."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from blobstore_server.libs.proto.clustermgr import POLICY_KEY, CodeModePolicy
from blobstore_server.libs.proto.scheduler import BROKEN_AFTER_KEY, parse_broken_after
from blobstore_server.libs.proto.switches import OFF, ON, TaskType, parse_switch, switch_key


@dataclass(frozen=True)
class RuntimeKey:
    name: str
    parse: Callable[[str], object]  # the value as its readers take it; ValueError naming what is wrong
    doc: str


def _switch(task: TaskType) -> RuntimeKey:
    key = switch_key(task)
    return RuntimeKey(key, partial(parse_switch, key), f"{ON!r} or {OFF!r}: whether {task} work runs (unset: on)")


RUNTIME_KEYS: dict[str, RuntimeKey] = {key.name: key for key in (
    RuntimeKey(POLICY_KEY, CodeModePolicy.parse,
               "a JSON list of rules (code_mode, min_volumes, min_idle_volumes, max_size, enable): the code mode of "
               "an object by its size, and how many writable volumes clustermgr keeps of each"),
    RuntimeKey(BROKEN_AFTER_KEY, parse_broken_after,
               "seconds without a heartbeat after which the scheduler declares a disk broken and repairs it, or 'off'"),
    *(_switch(task) for task in TaskType),
)}


def check_runtime_value(key: str, value: str) -> None:
    """ValueError naming the known keys when `key` is not one, or what is wrong with `value`."""
    known = RUNTIME_KEYS.get(key)
    if known is None:
        raise ValueError(f"unknown config key {key!r}: the keys are {', '.join(RUNTIME_KEYS)}")
    known.parse(value)


def runtime_keys_help() -> str:
    """One line per key with its doc, for the CLI's help."""
    return "\n".join(f"{key.name}: {key.doc}" for key in RUNTIME_KEYS.values())
