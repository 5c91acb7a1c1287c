"""Code modes and their tactics (CubeFS BlobStore's `constCodeModeTactic`), kept as data, not branches.

The numeric values of `CodeMode` go on the wire and on disk, so they never change; they follow
CubeFS BlobStore's numbering so that the two stay comparable.

`CodeMode` is the one type a code mode has past the edge: a pydantic field of it takes the mode's name (any case)
or its number, and writes its number in JSON, as the volume records, Raft commands and allocation requests always
carried it; `CodeModeName` writes the name instead, where people read and write the value (configs, the size
policy). Anything else that arrives as text (a header, a CLI option) goes through `parse_code_mode` once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, PlainSerializer
from pydantic_core import CoreSchema, core_schema

from blobstore_server.libs.ec.errors import UnknownCodeMode

ALIGN_2KB = 2048
MAX_BLOB_SIZE = 32 * 1024 * 1024


class CodeMode(IntEnum):
    """Erasure code modes; values are stable identifiers (do not renumber)."""

    EC15P12 = 1
    EC6P6 = 2
    EC16P20L2 = 3
    EC6P10L2 = 4
    EC6P3L3 = 5
    EC4P4L2 = 8
    EC12P4 = 9
    EC16P4 = 10
    EC3P3 = 11
    EC10P4 = 12
    EC6P3 = 13

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """As a model field: parsed from a name or number (`parse_code_mode`), then an ordinary int enum."""
        return core_schema.no_info_before_validator_function(parse_code_mode, handler(source))


# A code mode written as its name in JSON (configs, the size policy); read like any `CodeMode`.
CodeModeName = Annotated[CodeMode, PlainSerializer(lambda mode: mode.name, return_type=str, when_used="json")]


@dataclass(frozen=True)
class Tactic:
    """Shape of one code mode: N data, M global parity, L local parity shards spread over AZs.

    Shards are laid out |N data|M parity|L local|. With A AZs, local stripe i holds data
    [i*N/A, (i+1)*N/A), parity [i*M/A, (i+1)*M/A) and local parity [i*L/A, (i+1)*L/A);
    its local parity is the XOR of the other members, so one loss per stripe is repaired inside the AZ.
    """

    n: int
    m: int
    l: int  # noqa: E741 - the seed's name for the local parity count
    az_count: int
    put_quorum: int
    min_shard_size: int = ALIGN_2KB

    def __post_init__(self) -> None:
        if self.l:
            a = self.az_count
            if self.n % a or self.m % a or self.l != a:
                raise ValueError(f"LRC tactic needs N, M divisible by AZ count and one local per AZ: {self}")

    @property
    def total(self) -> int:
        """Number of shards in a stripe: N + M + L."""
        return self.n + self.m + self.l

    @property
    def global_count(self) -> int:
        """Shards of the global Reed-Solomon stripe: N + M."""
        return self.n + self.m

    @property
    def put_slack(self) -> int:
        """Shards of a stripe that may go unwritten while a PUT still reaches its quorum."""
        return self.total - self.put_quorum

    @property
    def is_lrc(self) -> bool:
        return self.l > 0

    def shard_size(self, blob_len: int) -> int:
        """Bytes per shard for a blob: max(ceil(len/N), min_shard_size); the tail is zero padded."""
        return max(-(-blob_len // self.n), self.min_shard_size)

    def unit_az(self, index: int) -> int:
        """The AZ slot (0..A-1) of shard/unit `index`: each AZ holds N/A data, M/A parity, L/A local."""
        a = self.az_count
        if index < self.n:
            return index // (self.n // a)
        if index < self.n + self.m:
            return (index - self.n) // (self.m // a)
        return (index - self.n - self.m) // max(1, self.l // a)

    def local_stripes(self) -> tuple[tuple[int, ...], ...]:
        """Shard indexes of each local stripe (data, global parity, then its local parity)."""
        if not self.l:
            return ()
        a = self.az_count
        dn, pm, ll = self.n // a, self.m // a, self.l // a
        return tuple(
            tuple(range(i * dn, (i + 1) * dn))
            + tuple(range(self.n + i * pm, self.n + (i + 1) * pm))
            + tuple(range(self.n + self.m + i * ll, self.n + self.m + (i + 1) * ll))
            for i in range(a)
        )

    def local_stripe_of(self, index: int) -> tuple[int, ...]:
        """The local stripe holding shard `index`, or () for a non-LRC mode."""
        for stripe in self.local_stripes():
            if index in stripe:
                return stripe
        return ()


_TACTICS: dict[CodeMode, Tactic] = {
    CodeMode.EC15P12: Tactic(n=15, m=12, l=0, az_count=3, put_quorum=24),
    CodeMode.EC6P6: Tactic(n=6, m=6, l=0, az_count=3, put_quorum=11),
    CodeMode.EC16P20L2: Tactic(n=16, m=20, l=2, az_count=2, put_quorum=34),
    CodeMode.EC6P10L2: Tactic(n=6, m=10, l=2, az_count=2, put_quorum=14),
    CodeMode.EC12P4: Tactic(n=12, m=4, l=0, az_count=1, put_quorum=15),
    CodeMode.EC16P4: Tactic(n=16, m=4, l=0, az_count=1, put_quorum=19),
    CodeMode.EC3P3: Tactic(n=3, m=3, l=0, az_count=1, put_quorum=5),
    CodeMode.EC10P4: Tactic(n=10, m=4, l=0, az_count=1, put_quorum=13),
    CodeMode.EC6P3: Tactic(n=6, m=3, l=0, az_count=1, put_quorum=8),
    CodeMode.EC6P3L3: Tactic(n=6, m=3, l=3, az_count=3, put_quorum=9),
    CodeMode.EC4P4L2: Tactic(n=4, m=4, l=2, az_count=2, put_quorum=6),
}


def parse_code_mode(value: object) -> CodeMode:
    """Accept a mode, its stable number or its name ("EC6P3", case-insensitive); UnknownCodeMode for anything
    else (a bool too: JSON's `true` is no mode)."""
    if isinstance(value, CodeMode):
        return value
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UnknownCodeMode(f"unknown code mode {value!r}; known: {', '.join(CodeMode.__members__)}")
    if isinstance(value, str):
        name = value.strip().upper()
        if name in CodeMode.__members__:
            return CodeMode[name]
        if not name.isdigit():
            raise UnknownCodeMode(f"unknown code mode {value!r}; known: {', '.join(CodeMode.__members__)}")
        value = int(name)
    try:
        return CodeMode(value)
    except ValueError:
        known = ", ".join(f"{m.name}={m.value}" for m in CodeMode)
        raise UnknownCodeMode(f"unknown code mode number {value!r}; known: {known}") from None


def tactic(mode: CodeMode) -> Tactic:
    """The tactic of a code mode."""
    return _TACTICS[mode]
