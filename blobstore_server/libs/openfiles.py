"""The open-file limit. A blobnode keeps every chunk file open (a full 16 TB disk holds ~1,000 chunks of 16 GiB)
and RocksDB its table files, while the soft limit most systems start a process with is 1,024: past it every
chunk creation, compaction and accepted connection fails with EMFILE. The hard limit is what the operator
granted (systemd's LimitNOFILE, often 524,288); any process may lift its soft limit up to it."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

# What Linux allows at most unless fs.nr_open was raised: the target when the hard limit is unlimited.
NR_OPEN_DEFAULT = 1 << 20


def lift_open_file_limit(needed: int = 0) -> int:
    """Raise this process's soft limit on open files to its hard limit; the limit in force after. Warns when that
    is below `needed`, the most this process may hold open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NR_OPEN_DEFAULT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning("the open-file limit is %d but this process may need %d open files: raise the hard limit "
                    "(ulimit -Hn, systemd LimitNOFILE=) or new chunks and connections will fail", soft, needed)
    return soft
