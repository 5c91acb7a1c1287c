"""The blobnode's unit lock: shared puts, exclusive compaction, and the event loop's non-blocking try."""

from __future__ import annotations

import threading
import time

from blobstore_server.services.blobnode.rwlock import RWLock


def test_shared_holds_coexist_and_a_try_fails_only_while_a_writer_holds_or_waits() -> None:
    lock = RWLock()
    assert lock.acquire_shared(blocking=False) and lock.acquire_shared(blocking=False)
    writer_in = threading.Event()

    def compact() -> None:
        with lock.exclusive():
            writer_in.set()
            time.sleep(0.2)

    writer = threading.Thread(target=compact)
    writer.start()
    deadline = time.monotonic() + 5
    while lock.acquire_shared(blocking=False):  # granted until the writer waits for the two readers
        lock.release_shared()
        assert time.monotonic() < deadline, "the writer never queued up"
        time.sleep(0.01)
    assert not writer_in.is_set()  # a waiting writer goes first, and waits for the readers already in
    lock.release_shared()
    lock.release_shared()
    assert writer_in.wait(2)
    assert not lock.acquire_shared(blocking=False)  # the writer holds it
    writer.join()
    assert lock.acquire_shared(blocking=False)
    lock.release_shared()
