"""How long a grant stays usable, saved across a restart without the restart ever stretching it; pure.

Within a process a grant's time is counted on the monotonic clock, from when its request was sent. That clock
does not survive the process, so a saved grant keeps the seconds it had left and when that was, on two clocks:

- the boot clock (CLOCK_BOOTTIME), with the boot's id: never stepped, it counts suspend too, and within one boot
  it measures how long the process was away. That is what is taken off.
- the wall clock: an operator or NTP may step it either way, so it is only ever used to SHORTEN what is left,
  when it says more time went by than the boot clock does (then the grant ends early: safe).

So a grant comes back with at most the time it truly has left. After a reboot (another boot id, or none
readable) nothing but the wall clock would say how long the machine was down, and a wall clock is least to be
trusted just after a boot (set from a drifting RTC before NTP steps it), so a saved grant then counts as spent:
its bytes go back to the allocator. A reboot takes much of a lease's length anyway.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Clocks:
    """One reading of the clocks a saved deadline is measured with."""

    boot_id: str  # empty when unknown: no boot is then taken for this one
    boot: float  # seconds since the machine started (CLOCK_BOOTTIME)
    wall: float  # time.time()


class SavedDeadline(BaseModel):
    left: float  # seconds the grant had left when saved
    boot_id: str
    boot: float
    wall: float


@functools.cache
def _boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def read_clocks() -> Clocks:
    return Clocks(_boot_id(), time.clock_gettime(time.CLOCK_BOOTTIME), time.time())


def save_deadline(left: float, clocks: Clocks) -> SavedDeadline:
    return SavedDeadline(left=left, boot_id=clocks.boot_id, boot=clocks.boot, wall=clocks.wall)


def left_after_restart(saved: SavedDeadline, clocks: Clocks) -> float:
    """The seconds a saved deadline has left now, never more than it truly has; 0 after a reboot (see the module
    docstring)."""
    if not saved.boot_id or saved.boot_id != clocks.boot_id:
        return 0.0
    return saved.left - max(clocks.boot - saved.boot, clocks.wall - saved.wall)
