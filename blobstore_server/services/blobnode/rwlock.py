"""A readers-writer lock: shard I/O shares a chunk, compaction takes it alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    def acquire_shared(self, blocking: bool = True) -> bool:
        """Take a shared hold; without `blocking`, False instead of waiting."""
        with self._cond:
            if not self._writer and not self._writers_waiting:  # the usual case, without wait_for's machinery
                self._readers += 1
                return True
            # Waiting writers go first so a stream of puts cannot starve compaction.
            if not self._cond.wait_for(lambda: not self._writer and not self._writers_waiting,
                                       None if blocking else 0):
                return False
            self._readers += 1
            return True

    def release_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:  # only a writer waits for readers, and only for the last to leave
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()
