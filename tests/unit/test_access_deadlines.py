"""A standby grant's time saved across a restart: never stretched, whatever the wall clock did (deadlines.py)."""

from __future__ import annotations

import pytest

from blobstore_server.services.access.deadlines import Clocks, left_after_restart, read_clocks, save_deadline
from blobstore_server.services.access.standby import Grant
from blobstore_server.services.access.statefile import SavedGrant

BOOT = "3c1d6f1e-boot-one"
HOUR = 3600.0
AT_SAVE = Clocks(BOOT, boot=1000.0, wall=1_800_000_000.0)


@pytest.mark.parametrize(("away", "wall_step", "left"), [
    (10.0, 0.0, 20.0),  # down 10 s: 20 s left
    (10.0, -HOUR, 20.0),  # the wall clock stepped back an hour meanwhile: no stretch
    (10.0, 5.0, 15.0),  # stepped forward 5 s: the grant is shortened (safe), never lengthened
    (40.0, 0.0, -10.0),  # down longer than the grant had: gone
])
def test_within_one_boot_the_boot_clock_measures_the_time_away(away: float, wall_step: float, left: float) -> None:
    saved = save_deadline(30.0, AT_SAVE)
    now = Clocks(BOOT, boot=AT_SAVE.boot + away, wall=AT_SAVE.wall + away + wall_step)
    assert left_after_restart(saved, now) == pytest.approx(left)


@pytest.mark.parametrize(("saved_boot", "boot_now"), [(BOOT, "another-boot"), ("", ""), (BOOT, "")])
def test_after_a_reboot_or_with_no_boot_id_a_saved_grant_counts_as_spent(saved_boot: str, boot_now: str) -> None:
    """Only the wall clock could say how long the machine was down, and it may have been set back at boot."""
    saved = save_deadline(30.0, Clocks(saved_boot, AT_SAVE.boot, AT_SAVE.wall))
    assert left_after_restart(saved, Clocks(boot_now, boot=3.0, wall=AT_SAVE.wall - HOUR)) == 0.0


def test_never_more_than_the_time_truly_left() -> None:
    """Every combination of time away, wall-clock step and reboot: what comes back is at most what is truly left."""
    saved = save_deadline(30.0, AT_SAVE)
    for away in (0.0, 0.5, 7.0, 29.0, 31.0, 600.0):
        for step in (-HOUR, -60.0, -1.0, 0.0, 1.0, 60.0):
            truly_left = max(0.0, 30.0 - away)
            same = Clocks(BOOT, boot=AT_SAVE.boot + away, wall=AT_SAVE.wall + away + step)
            assert left_after_restart(saved, same) <= truly_left
            rebooted = Clocks("other", boot=min(away, 3.0), wall=AT_SAVE.wall + away + step)  # booted 3 s ago
            assert left_after_restart(saved, rebooted) <= truly_left


def test_a_saved_grant_comes_back_on_the_new_process_clock_with_what_it_has_left() -> None:
    grant = Grant(vid=4, disks=(1, 2), first_bid=100, next_bid=107, bids_left=93, bytes_left=5000,
                  usable_until=530.0)
    at_save = read_clocks()
    saved = SavedGrant.model_validate_json(SavedGrant.of(11, grant, 500.0, at_save).model_dump_json())
    later = Clocks(at_save.boot_id, boot=at_save.boot + 12.0, wall=at_save.wall + 12.0)
    back = saved.grant(now=7.0, clocks=later)  # a new process: its monotonic clock starts anew
    assert back.usable_until == pytest.approx(7.0 + 30.0 - 12.0)
    assert (saved.mode, back.vid, back.disks, back.first_bid, back.next_bid, back.bids_left, back.bytes_left) == (
        11, 4, (1, 2), 100, 107, 93, 5000)
