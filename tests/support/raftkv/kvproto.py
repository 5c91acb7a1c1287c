"""Wire format between kvclient and kvserver (one frame per request and per response)."""

from __future__ import annotations

import struct
from enum import IntEnum

REQ_HEAD = struct.Struct("!QB")  # request id, op
RESP_HEAD = struct.Struct("!QB")  # request id, status
_KLEN = struct.Struct("!BI")


class Op(IntEnum):
    PUT = 1
    DELETE = 2
    GET = 3  # linearizable (ReadIndex on the leader)
    STATUS = 4
    CHECKSUM = 5
    ADD_LEARNER = 6
    PROMOTE = 7
    REMOVE = 8


class Status(IntEnum):
    OK = 0
    NOT_LEADER = 1  # payload: the leader's node id, if known
    ERROR = 2
    TIMEOUT = 3  # outcome unknown


def encode_put(op: Op, key: bytes, value: bytes = b"") -> bytes:
    """The replicated command: also the payload of a PUT/DELETE request."""
    return _KLEN.pack(op, len(key)) + key + value


def decode_put(command: bytes) -> tuple[Op, bytes, bytes]:
    op, klen = _KLEN.unpack_from(command)
    start = _KLEN.size
    return Op(op), command[start:start + klen], command[start + klen:]
