"""The command table: `Command`, the base of every command's typed payload, and `COMMANDS`, which maps the name
written in the log to (model, apply function) (the commands themselves: the other modules of this package, which
fill it when the package is imported); encoding, decoding and applying a logged command.

Nothing is looked up by reflection. A command is logged as `{"op", "now", "args"}` with `args` the model's fields,
the same bytes as before commands were typed, so logs written earlier replay unchanged; a command sent in a client
session also carries `"session"` (see `sessions.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from blobstore_server.libs.kv import Batch
from blobstore_server.libs.proto.clustermgr import Fence, lease_epoch
from blobstore_server.libs.rpc.errors import BadRequest, Fenced, RpcError, error_from_response
from blobstore_server.services.clustermgr.sessions import LoggedSession
from blobstore_server.services.clustermgr.state import ClusterState

R = TypeVar("R", bound=BaseModel)


class Command(BaseModel, Generic[R]):
    """A command's payload; subclass as `Command[ResultModel]` and name it with `op`. Where a route's request body
    carries exactly the command's fields, the command is that body with an `op` (`class ScopeAlloc(api.ScopeAlloc,
    Command[ScopeRange])`): the route takes the command as its body and proposes it as it came."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    op: ClassVar[str]
    result_type: ClassVar[type[BaseModel]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # The result model is the generic argument: `class ScopeAlloc(Command[ScopeRange])`.
        for base in cls.__mro__:
            args = getattr(base, "__pydantic_generic_metadata__", {}).get("args")
            if args:
                cls.result_type = args[0]
                return


@dataclass(frozen=True)
class Entry:
    model: type[Command[Any]]
    apply: Callable[[ClusterState, Batch, float, Any], BaseModel]


COMMANDS: dict[str, Entry] = {}
C = TypeVar("C", bound=Command[Any])


def command(model: type[C]) -> Callable[[Callable[[ClusterState, Batch, float, C], R]],
                                        Callable[[ClusterState, Batch, float, C], R]]:
    """Register the function that applies `model` under `model.op`."""

    def register(apply: Callable[[ClusterState, Batch, float, C], R]) -> Callable[[ClusterState, Batch, float, C], R]:
        if model.op in COMMANDS:
            raise ValueError(f"command {model.op!r} is registered twice")
        COMMANDS[model.op] = Entry(model, apply)
        return apply

    return register


def encode(cmd: Command[Any], now: float, session: LoggedSession | None = None) -> bytes:
    entry: dict[str, object] = {"op": cmd.op, "now": now, "args": cmd.model_dump(mode="json")}
    if session is not None:
        entry["session"] = session.model_dump()
    return json.dumps(entry, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Logged:
    """One log entry, decoded: the command's name, the leader's clock, its raw args, its session."""

    op: str
    now: float
    args: Any
    session: LoggedSession | None


_MALFORMED = (ValueError, TypeError, KeyError, AttributeError)  # pydantic's ValidationError is a ValueError


def decode(raw: bytes) -> Logged:
    """Raises BadRequest for bytes that are not a logged command."""
    try:
        entry = json.loads(raw)
        session = entry.get("session")
        return Logged(str(entry.get("op", "")), float(entry["now"]), entry.get("args"),
                      None if session is None else LoggedSession.model_validate(session))
    except _MALFORMED as exc:
        raise BadRequest(f"malformed command: {exc}") from None


def apply(state: ClusterState, batch: Batch, logged: Logged) -> tuple[bytes, bool]:
    """Apply one logged command to `batch`: the answer every replica agrees on, and whether the command
    was accepted. A refused one may have written part of `batch`: the caller must drop it."""
    try:
        entry = COMMANDS.get(logged.op)
        if entry is None:
            raise BadRequest(f"unknown command {logged.op!r}")
        fence = logged.session.fence if logged.session else None
        if fence is not None:
            check_fence(state, fence)
        result = entry.apply(state, batch, logged.now, entry.model.model_validate(logged.args))
    except RpcError as exc:
        return refusal(exc), False
    except _MALFORMED as exc:
        return refusal(BadRequest(f"malformed command: {exc}")), False
    return json.dumps({"ok": result.model_dump(mode="json")}, separators=(",", ":")).encode(), True


def check_fence(state: ClusterState, fence: Fence) -> None:
    """Refuse a command sent under a lease epoch the lease record no longer carries: its holder was
    superseded (or never held it). Judged here, in the log's order, not by anyone's clock."""
    current = lease_epoch(state.kv_get(fence.key))
    if current != fence.epoch:
        raise Fenced(f"sent under epoch {fence.epoch} of lease {fence.key!r}, which is at epoch {current}: refused",
                     key=fence.key, epoch=current)


def refusal(exc: RpcError) -> bytes:
    """The answer of a refused command: the typed error, as every replica gives it."""
    return json.dumps({"error": exc.to_json()}, separators=(",", ":")).encode()


def decode_result(raw: bytes, result_type: type[R]) -> R:
    """The proposer's side of `apply`: the result, or the typed error every replica agreed on."""
    answer = json.loads(raw)
    if "error" in answer:
        raise error_from_response(0, answer["error"])
    return result_type.model_validate(answer["ok"])


class Proposer(Protocol):
    """Commits a command through Raft and answers its result (the manager's `propose`)."""

    async def __call__(self, cmd: Command[R], /) -> R: ...
