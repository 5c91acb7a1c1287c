"""Volume-unit and chunk identifiers, shared by every service.

A vuid packs `vid << 32 | unit_index << 24 | epoch`. The epoch grows whenever a unit
moves to a new chunk, so a writer or reader still holding the old vuid is detected.
A chunk id is the vuid plus the creation time in nanoseconds: two chunks made for the
same unit (e.g. after compaction) never collide, and the id names the file on disk.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

_U64 = (1 << 64) - 1
MAX_VID = (1 << 32) - 1
MAX_INDEX = (1 << 8) - 1
MAX_EPOCH = (1 << 24) - 1


def epoch_of(vuid: int) -> int:
    """The epoch of a vuid given as a plain int (no `Vuid` made: this is on every shard request's path)."""
    return vuid & MAX_EPOCH


class Vuid(int):
    """A vuid as an int with accessors; plain ints are accepted everywhere a vuid is."""

    __slots__ = ()

    def __new__(cls, value: int) -> Vuid:
        if not 0 <= value <= _U64:
            raise ValueError(f"vuid {value} out of u64 range")
        return super().__new__(cls, value)

    @classmethod
    def make(cls, vid: int, index: int, epoch: int) -> Vuid:
        if not 0 <= vid <= MAX_VID:
            raise ValueError(f"vid {vid} out of range")
        if not 0 <= index <= MAX_INDEX:
            raise ValueError(f"unit index {index} out of range")
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch {epoch} out of range")
        return cls(vid << 32 | index << 24 | epoch)

    def vid(self) -> int:
        return int(self) >> 32

    def index(self) -> int:
        return (int(self) >> 24) & MAX_INDEX

    def epoch(self) -> int:
        return epoch_of(self)

    def __repr__(self) -> str:
        return f"Vuid(vid={self.vid()}, index={self.index()}, epoch={self.epoch()})"


_CHUNK_ID = struct.Struct(">QQ")  # big-endian so byte order == (vuid, time) order
CHUNK_ID_SIZE = _CHUNK_ID.size


@dataclass(frozen=True, order=True)
class ChunkId:
    """vuid + creation timestamp (ns); 16 bytes on disk, 32 hex chars as a file name."""

    vuid: int
    timestamp: int

    def __post_init__(self) -> None:
        if not (0 <= self.vuid <= _U64 and 0 <= self.timestamp <= _U64):
            raise ValueError(f"chunk id fields out of u64 range: {self.vuid}, {self.timestamp}")

    @classmethod
    def new(cls, vuid: int) -> ChunkId:
        return cls(int(vuid), time.time_ns())

    def to_bytes(self) -> bytes:
        return _CHUNK_ID.pack(self.vuid, self.timestamp)

    @classmethod
    def from_bytes(cls, raw: bytes | bytearray | memoryview) -> ChunkId:
        if len(raw) != CHUNK_ID_SIZE:
            raise ValueError(f"chunk id needs {CHUNK_ID_SIZE} bytes, got {len(raw)}")
        vuid, ts = _CHUNK_ID.unpack(raw)
        return cls(vuid, ts)

    def __str__(self) -> str:
        return self.to_bytes().hex()

    @classmethod
    def parse(cls, text: str) -> ChunkId:
        if len(text) != 2 * CHUNK_ID_SIZE:
            raise ValueError(f"chunk id {text!r} must be {2 * CHUNK_ID_SIZE} hex chars")
        return cls.from_bytes(bytes.fromhex(text))

    @property
    def is_zero(self) -> bool:
        return self.vuid == 0 and self.timestamp == 0


ZERO_CHUNK_ID = ChunkId(0, 0)
