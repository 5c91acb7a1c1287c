"""An idle CPU cgroup for background processes (blobnode readers, the repair worker).

Nice and SCHED_IDLE rank a process only within its own group: an autogroup of nice 19 still competes as a group
with every other one, and the kernel lets a running group finish its slice before a woken user request gets the
core, which is where a rebuild's GET tail came from (issue 26). A cgroup with `cpu.idle` = 1 (Linux 5.15) is
preempted at once by anything else. The group sits below the caller's own cpu cgroup, so a service manager's
limits still hold, and is shared by every background process there, named `blobstore-background`.

Where no such group can be made (no permission, a kernel without `cpu.idle`, a cgroup v2 parent that holds
processes and so cannot hand the cpu controller down), `enter_idle_group` says so and callers keep nice.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)
GROUP = "blobstore-background"


def _cpu_cgroup(pid: int | str = "self") -> Path | None:
    """The directory of the cpu cgroup `pid` is in: in cgroup v1's cpu hierarchy if mounted, else v2's."""
    mounts: dict[str, tuple[str, Path]] = {}  # "cpu" (v1) or "" (v2) -> (the hierarchy's path at the mount, mount)
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            fstype, options = fields[fields.index("-") + 1], fields[-1].split(",")
            if fstype == "cgroup2" or (fstype == "cgroup" and "cpu" in options):
                mounts.setdefault("cpu" if fstype == "cgroup" else "", (fields[3], Path(fields[4])))
        memberships = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines())
    except (OSError, ValueError):
        return None
    v1 = next((path for controllers, path in memberships.items() if "cpu" in controllers.split(",")), None)
    for key, path in (("cpu", v1), ("", memberships.get(""))):
        if key in mounts and path is not None:
            root, mount = mounts[key]
            if not path.startswith(root):
                return None  # a group outside what this mount shows (another namespace's)
            return mount / path[len(root):].lstrip("/")
    return None


def idle_group_of(pid: int | str = "self") -> bool:
    """Whether `pid` runs in an idle cpu cgroup."""
    group = _cpu_cgroup(pid)
    try:
        return group is not None and (group / "cpu.idle").read_text().strip() == "1"
    except OSError:
        return False


def enter_idle_group() -> Path | None:
    """Move this process (all its threads) into the idle group beside it, making it if needed; None if it cannot."""
    group = idle_group_beside()
    if group is None:
        return None
    if group.parent.name == GROUP:  # started by a process already in it
        group = group.parent
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.idle").write_text("1")
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        log.info("no idle cpu cgroup at %s (%s): background work runs at nice only", group, exc.strerror)
        with contextlib.suppress(OSError):
            group.rmdir()  # only if this call made it: a group in use is not empty
        return None
    return group


def idle_group_beside() -> Path | None:
    """Where `enter_idle_group` puts a process started from here."""
    own = _cpu_cgroup()
    return None if own is None else own / GROUP


def leave_idle_group(group: Path) -> None:
    """Move this process back to the group it came from, and remove the idle one if nothing else runs there."""
    with contextlib.suppress(OSError):
        (group.parent / "cgroup.procs").write_text(str(os.getpid()))
    remove_idle_group(group)


def remove_idle_group(group: Path, wait: float = 1.0) -> None:
    """Remove the idle group once nothing runs in it (the last one out does it): a group another process runs in
    stays; one whose last processes just died is removed once they are reaped (for up to `wait` seconds)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            group.rmdir()
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return
            if exc.errno != errno.EBUSY:
                log.warning("cannot remove the idle cpu cgroup %s: %s", group, exc)
                return
        if _anyone_running(group) or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _anyone_running(group: Path) -> bool:
    try:
        pids = (group / "cgroup.procs").read_text().split()
    except OSError:
        return False
    for pid in pids:
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
    return False
