"""A steady PUT stream through the SDK, as a user's application writes: every attempt recorded with its start
time, every acknowledged object kept to read back."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import httpx

from blobstore import BlobstoreError, Client, NotFound
from tests.support.processes import wait_until


class Attempt(NamedTuple):
    started: float
    ok: bool
    error: str
    ended: float


@dataclass
class PutStream:
    """Writer threads PUTting random objects of up to `max_size` bytes through a client of every URL in `urls`,
    each at most `rate` PUTs a second (None: as fast as they are answered); https ones checked against `ca`."""

    urls: Sequence[str]
    max_size: int = 64 << 10
    rate: float | None = None
    ca: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    acked: dict[str, bytes] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def writer(self, seed: int) -> None:
        rng = random.Random(seed)
        due = time.monotonic()
        with Client(self.urls, timeout=60, ca=self.ca) as client:
            while not self.stop.is_set():
                if self.rate is not None:
                    due = max(due + 1 / self.rate, time.monotonic())
                    if self.stop.wait(due - time.monotonic()):
                        break
                data = rng.randbytes(rng.randrange(1, self.max_size))
                started = time.monotonic()
                try:
                    token = client.put(data)
                except BlobstoreError as exc:
                    self.attempts.append(Attempt(started, False, str(exc), time.monotonic()))
                    continue
                self.attempts.append(Attempt(started, True, "", time.monotonic()))
                self.acked[token] = data

    def start(self, writers: int = 2) -> None:
        """Writer threads from now on, until `close`."""
        self.threads = [threading.Thread(target=self.writer, args=(seed,)) for seed in range(writers)]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def since(self, moment: float, until: float = float("inf")) -> list[Attempt]:
        return [a for a in list(self.attempts) if moment <= a.started < until]

    def wait_for(self, count: int, moment: float = 0.0, timeout: float = 60.0) -> None:
        wait_until(lambda: len(self.since(moment)) >= count, timeout, f"{count} PUTs", interval=0.1)


@contextmanager
def put_stream(urls: str | Sequence[str], writers: int = 4, max_size: int = 64 << 10,
               rate: float | None = None, ca: str | None = None) -> Iterator[PutStream]:
    stream = PutStream([urls] if isinstance(urls, str) else list(urls), max_size, rate, ca)
    stream.start(writers)
    try:
        yield stream
    finally:
        stream.close()


def read_back(urls: str | Sequence[str], acked: dict[str, bytes], readers: int = 8,
              ca: str | None = None) -> list[str]:
    """Tokens of acknowledged objects that do not read back byte for byte (`readers` reads at a time; https
    access nodes checked against `ca`)."""
    with Client(urls, timeout=60, ca=ca) as client, ThreadPoolExecutor(readers) as pool:
        same = pool.map(lambda item: client.get(item[0]) == item[1], acked.items())
        return [token for token, ok in zip(acked, same, strict=True) if not ok]


def success_rate(attempts: list[Attempt]) -> float:
    return sum(a.ok for a in attempts) / len(attempts)


def failures(attempts: list[Attempt]) -> list[tuple[str, int]]:
    """The commonest errors among `attempts`, for an assertion's message."""
    return Counter(a.error[:300] for a in attempts if not a.ok).most_common(3)


def wait_for_put(client: httpx.Client, data: bytes, timeout: float = 20) -> str:
    """The first PUT waits for volumes to be created and leased."""
    deadline = time.monotonic() + timeout
    while True:
        resp = client.put("/blob", content=data)
        if resp.status_code == 200 or time.monotonic() > deadline:
            assert resp.status_code == 200, resp.text
            return str(resp.json()["location"])
        time.sleep(0.2)


def wait_deleted(url: str, locations: Sequence[str], timeout: float, what: str) -> None:
    """Wait until a GET of every Location through the access node at `url` answers NotFound."""
    def gone(client: Client, location: str) -> bool:
        try:
            client.get(location)
        except NotFound:
            return True
        return False

    with Client(url) as client:
        wait_until(lambda: all(gone(client, loc) for loc in locations), timeout, what)
