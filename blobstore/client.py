"""The SDK: `AsyncClient` does all the work on httpx; `Client` is a thin blocking wrapper around it.

httpx applies the policy; the bytes move through aiohttp, as httpx's transport (httpx-aiohttp, its answers read
in the pieces aiohttp received): httpx's own (h11 and anyio) cost ~4x the client CPU per small request and ~2x
per 16 MiB GET (bench/sdk.py).

Every request goes to up to three randomly chosen access hosts (the CubeFS access client does the
same): a connection failure, a timeout or a 502/503/504 moves on to the next one. Bodies stream both
ways with constant memory: an upload is a generator with an explicit Content-Length, a download is
read piece by piece.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlsplit

import aiohttp
import httpx
import yarl
from httpx_aiohttp.transport import AiohttpResponseStream, AiohttpTransport, map_aiohttp_exceptions

from blobstore import memory
from blobstore.errors import (
    RETRYABLE_STATUS,
    BadRequest,
    BlobstoreError,
    Unavailable,
    UploadIncomplete,
    error_from_answer,
)
from blobstore.records import (
    READ_PLAN_TYPE,
    AllocRequest,
    AllocResult,
    PutResult,
    ReadPlan,
    ShardPiece,
    Stat,
    UndeleteRequest,
    UndeleteResult,
    Upload,
)
from blobstore.signing import AUTH_HEADER, Grant

CHUNK = 1 << 20
DIRECT_WINDOW = 32 << 20  # bytes of a read plan being read from blobnodes at once
DIRECT_PAUSE = 60.0  # seconds a blobnode that could not be reached is read through access
_ACCEPT_PLAN = f"{READ_PLAN_TYPE}, application/octet-stream"
MAX_TRIES = 3  # hosts tried per request
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,512}")

Progress = Callable[[int, int], object]  # (bytes done, bytes in total)
Data = bytes | bytearray | memoryview | BinaryIO | Iterable[bytes] | AsyncIterable[bytes]
T = TypeVar("T")


def _normalize_hosts(hosts: str | Iterable[str], scheme: str = "http") -> list[str]:
    listed = [hosts] if isinstance(hosts, str) else list(hosts)
    normalized = [(h if "://" in h else f"{scheme}://{h}").rstrip("/") for h in listed if h]
    if not normalized:
        raise ValueError("the client needs at least one access host")
    return normalized


def _untrusted_hint(exc: BaseException) -> str:
    """What to do when a host's certificate was not trusted: a cluster's own CA is no system root."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    return "" if cause is None else " (pass the cluster's CA certificate: Client(..., ca='ca.pem'))"


def _blob_path(location: str) -> str:
    if not _TOKEN.fullmatch(location):
        raise BadRequest(f"{location[:40]!r} is not a location token", code="bad_request")
    return f"/blob/{location}"


def _range_header(offset: int, size: int | None) -> dict[str, str]:
    if offset < 0 or (size is not None and size < 0):
        raise ValueError(f"offset {offset} and size {size} must not be negative")
    if offset == 0 and size is None:
        return {}
    return {"range": f"bytes={offset}-" if size is None else f"bytes={offset}-{offset + size - 1}"}


class _Upload:
    """A PUT body of known size, replayable to another host unless a one-shot iterator was started."""

    def __init__(self, data: Data, size: int | None, progress: Progress | None) -> None:
        self._data = data
        self._progress = progress
        self._started = False
        self._file_start: int | None = None
        if isinstance(data, bytes | bytearray | memoryview):
            self.size = len(data) if size is None else size
        elif hasattr(data, "read"):
            self.size = size if size is not None else self._file_size(data)  # type: ignore[arg-type]
            with contextlib.suppress(OSError, ValueError):
                self._file_start = data.tell() if data.seekable() else None  # type: ignore[union-attr]
        elif size is None:
            raise ValueError("put(iterator) needs size=: access requires the Content-Length up front")
        else:
            self.size = size
        if self.size < 0:
            raise ValueError(f"size {self.size} is negative")

    @staticmethod
    def _file_size(f: BinaryIO) -> int:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            st = os.fstat(f.fileno())
            if st.st_mode & 0o170000 == 0o100000:  # a regular file
                return st.st_size - f.tell()
        try:
            here = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(here)
            return end - here
        except (OSError, ValueError) as exc:
            raise ValueError("cannot tell the size of this file object; pass size=") from exc

    @property
    def replayable(self) -> bool:
        return not self._started or isinstance(self._data, bytes | bytearray | memoryview) or (
            self._file_start is not None)

    async def content(self) -> AsyncIterator[bytes]:
        """The body from its start, checked against the declared size, reporting progress as it goes."""
        sent = 0
        async for piece in self._pieces():
            sent += len(piece)
            if sent > self.size:
                raise ValueError(f"the body is longer than size={self.size}")
            yield piece
            if self._progress is not None:
                self._progress(sent, self.size)
        if sent != self.size:
            raise ValueError(f"the body ended after {sent} bytes but size={self.size}")

    async def _pieces(self) -> AsyncIterator[bytes]:
        self._started = True
        data = self._data
        if isinstance(data, bytes | bytearray | memoryview):
            view = memoryview(data)
            for start in range(0, len(view), CHUNK):
                yield bytes(view[start:start + CHUNK])
        elif hasattr(data, "read"):
            if self._file_start is not None:
                data.seek(self._file_start)  # type: ignore[union-attr]
            left = self.size
            while left > 0:
                piece = await asyncio.to_thread(data.read, min(CHUNK, left))  # type: ignore[union-attr]
                if not piece:
                    return
                left -= len(piece)
                yield piece
        elif isinstance(data, AsyncIterable):
            async for piece in data:
                yield bytes(piece)
        else:
            for piece in data:
                yield bytes(piece)


async def _parts(body: AsyncIterator[bytes], blob_size: int) -> AsyncIterator[tuple[int, bytes]]:
    """The body cut into blob-sized parts, numbered."""
    buffer, index = bytearray(), 0
    async for piece in body:
        buffer += piece
        while len(buffer) >= blob_size:
            yield index, bytes(buffer[:blob_size])
            del buffer[:blob_size]
            index += 1
    if buffer:
        yield index, bytes(buffer)


class _ReceivedPieces(AiohttpResponseStream):
    """An answer's bytes in the pieces aiohttp received them in. httpx-aiohttp's own stream re-cuts them into
    16 KiB pieces, a copy of every byte and ~5 us per piece: a 16 MiB GET cost 1.8x aiohttp's client CPU."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with map_aiohttp_exceptions():
            async for piece in self._aiohttp_response.content.iter_any():
                yield piece


class _Transport(AiohttpTransport):
    """httpx-aiohttp, its answers read through `_ReceivedPieces`."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if isinstance(response.stream, AiohttpResponseStream):
            response.stream = _ReceivedPieces(response.stream._aiohttp_response)
        return response


class _DirectReadFailed(Exception):
    """A piece of a read plan could not be read from its blobnode: the rest is read through access."""


async def _recut(pieces: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    """`pieces` as pieces of `size` bytes, the last one shorter."""
    buffer = bytearray()
    async for piece in pieces:
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


class AsyncClient:
    """Asynchronous access client; safe to share between tasks of one event loop.

    `direct_reads`: a large GET may be answered a read plan, and the client then reads the data shards from the
    blobnodes itself (half the cluster's CPU per large GET: access relays nothing); turn it off for a client
    that cannot reach the blobnodes (it would fall back to access after a timeout per GET).

    `keep_freed_memory`: the process's malloc keeps freed memory for reuse (`blobstore.memory`; glibc only, for
    the whole process, from the first client on): received bytes come in fresh buffers of up to 256 KiB, and with
    glibc's defaults their pages were faulted in and zeroed again and again (a 16 MiB GET at 0.6x the rate). The
    process may then hold up to 256 MiB of freed memory; False leaves malloc as it is.

    `grant`: a grant of the `undelete` capability (`blobstore auth grant undelete` prints one), which `undelete`
    signs with; without one it is sent unsigned, which only a cluster run without auth takes.

    `ca`: the cluster's CA certificate (a PEM file: `ca.pem` of a `cluster up --hosts` folder or a deploy bundle),
    which access nodes and blobnodes are checked against over https (a host without a scheme is then https://);
    None: the system's roots."""

    def __init__(self, hosts: str | Iterable[str], *, timeout: float = 60.0, connect_timeout: float = 3.0,
                 direct_reads: bool = True, keep_freed_memory: bool = True, grant: str | None = None,
                 ca: str | os.PathLike[str] | None = None) -> None:
        if keep_freed_memory:
            memory.keep_freed_memory()
        self.hosts = _normalize_hosts(hosts, "https" if ca is not None else "http")
        self._trusted = ssl.create_default_context(cafile=os.fspath(ca)) if ca is not None else None
        self._grant = Grant.from_token(grant) if grant is not None else None
        self._direct_reads = direct_reads
        self._unreachable: dict[str, float] = {}  # blobnode host:port -> until when its pieces go through access
        self._shards: aiohttp.ClientSession | None = None  # connections to blobnodes, made on the first direct read
        self._http = httpx.AsyncClient(transport=_Transport(verify=self._trusted or True),
                                       timeout=httpx.Timeout(timeout, connect=connect_timeout))

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._shards is not None:
            await self._shards.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @contextlib.asynccontextmanager
    async def _exchange(self, method: str, path: str, headers: dict[str, str] | None = None,
                        upload: _Upload | None = None, signed: bytes | None = None) -> AsyncIterator[httpx.Response]:
        """One request, tried on up to MAX_TRIES random hosts; yields the streaming 2xx response. `signed`: the
        request's body, signed with the client's grant for each host (a signature names the host it is sent to)."""
        what = f"{method} {path[:48]}"
        failures: list[str] = []
        for host in random.sample(self.hosts, min(MAX_TRIES, len(self.hosts))):
            if upload is not None and not upload.replayable:
                break
            content = upload.content() if upload is not None else None
            if signed is not None and self._grant is not None:
                headers = {**(headers or {}), AUTH_HEADER: self._grant.header(method, host + path, signed)}
            request = self._http.build_request(method, host + path, headers=headers, content=content)
            try:
                response = await self._http.send(request, stream=True)
            except httpx.TransportError as exc:
                failures.append(f"{host}: {type(exc).__name__}: {exc}{_untrusted_hint(exc)}")
                continue
            try:
                if response.status_code in RETRYABLE_STATUS:
                    failures.append(f"{host}: {error_from_answer(response.status_code, await response.aread(), what)}")
                    continue
                if response.status_code >= 300:
                    raise error_from_answer(response.status_code, await response.aread(), what)
                try:
                    yield response
                except httpx.TransportError as exc:
                    raise Unavailable(f"{what} via {host} broke off: {type(exc).__name__}: {exc}") from exc
                return
            finally:
                await response.aclose()
        raise Unavailable(f"{what}: no access host served it ({'; '.join(failures) or 'nothing tried'})")

    async def put(self, data: Data, *, size: int | None = None, code_mode: str | None = None,
                  progress: Progress | None = None, parallel: int = 1, upload: Upload | None = None) -> str:
        """Store an object and return its location token. Files and iterators are streamed.

        With `parallel` > 1 (or an `upload` to resume) the object goes up as a multipart upload, up to
        `parallel` parts at once (memory: that many blobs); a part that fails on every access host
        raises `UploadIncomplete`, whose `upload` resumes with only the missing parts."""
        if parallel > 1 or upload is not None:
            return await self._put_parts(_Upload(data, size, progress), code_mode, parallel, upload)
        upload_body = _Upload(data, size, progress)
        headers = {"content-length": str(upload_body.size), "content-type": "application/octet-stream"}
        if code_mode:
            headers["x-code-mode"] = code_mode
        async with self._exchange("PUT", "/blob", headers, upload_body) as response:
            await response.aread()
        return PutResult.model_validate_json(response.content).location

    async def alloc(self, size: int, code_mode: str | None = None) -> Upload:
        """Begin a multipart upload of an object of `size` bytes."""
        request = AllocRequest(size=size, code_mode=code_mode).model_dump_json().encode()
        headers = {"content-length": str(len(request)), "content-type": "application/json"}
        async with self._exchange("POST", "/blob/alloc", headers, _Upload(request, None, None)) as response:
            await response.aread()
        answer = AllocResult.model_validate_json(response.content)
        return Upload(answer.location, answer.tokens, answer.blob_size, size, answer.expiry)

    async def put_part(self, upload: Upload, index: int, data: bytes) -> None:
        """Write part `index` of `upload` (exactly `upload.part_size(index)` bytes); again is harmless."""
        headers = {"content-length": str(len(data)), "content-type": "application/octet-stream"}
        async with self._exchange("PUT", f"/blob/putat?token={upload.tokens[index]}", headers,
                                  _Upload(data, None, None)):
            pass
        upload.done.add(index)

    async def _put_parts(self, body: _Upload, code_mode: str | None, parallel: int, upload: Upload | None) -> str:
        if upload is None:
            upload = await self.alloc(body.size, code_mode)
        elif upload.size != body.size:
            raise ValueError(f"the upload is of {upload.size} bytes; this body has {body.size}")
        slots = asyncio.Semaphore(max(1, parallel))
        failures: dict[int, str] = {}

        async def send(index: int, part: bytes) -> None:
            try:
                await self.put_part(upload, index, part)
            except BlobstoreError as exc:
                failures[index] = str(exc)
            finally:
                slots.release()

        sending: list[asyncio.Task[None]] = []
        try:
            async for index, part in _parts(body.content(), upload.blob_size):
                if index not in upload.done:
                    await slots.acquire()
                    sending.append(asyncio.create_task(send(index, part)))
        except (OSError, ValueError) as exc:
            failures[-1] = f"reading the body: {type(exc).__name__}: {exc}"
        await asyncio.gather(*sending)
        if failures:
            raise UploadIncomplete(upload, failures)
        return upload.location

    async def _download(self, location: str, offset: int, size: int | None, chunk_size: int | None,
                        progress: Progress | None) -> AsyncGenerator[bytes, None]:
        """The answer's bytes in pieces of `chunk_size`, or (None) as they come off the socket: access sends
        them as they are (no content coding), and re-cutting them costs a copy of every byte."""
        pieces = self._received(location, offset, size, progress)
        async for piece in (pieces if chunk_size is None else _recut(pieces, chunk_size)):
            yield piece

    async def _received(self, location: str, offset: int, size: int | None, progress: Progress | None
                        ) -> AsyncGenerator[bytes, None]:
        """Bytes [offset, offset + size) as received. A large range may come as a read plan: its pieces are read
        from the blobnodes directly, and whatever of it fails is asked of access again, from that byte on."""
        path = _blob_path(location)
        if size == 0:
            return
        total: int | None = size  # bytes to return; from the first answer when reading to the end
        done = 0
        direct = self._direct_reads
        while total is None or done < total:
            headers = _range_header(offset + done, None if total is None else total - done)
            if direct:
                headers["accept"] = _ACCEPT_PLAN
            plan: ReadPlan | None = None
            async with self._exchange("GET", path, headers) as response:
                to_end = int(response.headers["x-object-size"]) - offset  # a range past the end is cut there
                total = to_end if total is None else min(total, to_end)
                if response.headers.get("content-type") == READ_PLAN_TYPE:
                    plan = ReadPlan.model_validate_json(await response.aread())
                else:
                    async for piece in response.aiter_raw():
                        done += len(piece)
                        yield piece
                        if progress is not None:
                            progress(done, total)
                    if done != total:
                        raise Unavailable(f"GET {path[:48]}: the answer ended after {done} of {total} bytes")
            if plan is None:
                continue
            try:
                if not plan.pieces or plan.size > total - done:
                    raise _DirectReadFailed(f"a plan of {plan.size} bytes for the {total - done} left")
                async for piece in self._read_direct(plan):
                    done += len(piece)
                    yield piece
                    if progress is not None:
                        progress(done, total)
            except _DirectReadFailed:
                direct = False  # the rest through access, which reads around what failed (and repairs it)

    async def _read_direct(self, plan: ReadPlan) -> AsyncIterator[bytes]:
        """The plan's pieces in order, read from the blobnodes up to `DIRECT_WINDOW` bytes ahead."""
        waiting = deque(plan.pieces)
        reading: deque[asyncio.Task[list[bytes]]] = deque()
        ahead = 0
        try:
            while waiting or reading:
                while waiting and (not reading or ahead + waiting[0].size <= DIRECT_WINDOW):
                    piece = waiting.popleft()
                    ahead += piece.size
                    reading.append(asyncio.create_task(self._read_piece(piece, plan.piece_timeout)))
                received = await reading[0]
                reading.popleft()
                ahead -= sum(len(part) for part in received)
                for part in received:
                    yield part
        finally:
            for task in reading:
                task.cancel()

    async def _read_piece(self, piece: ShardPiece, timeout: float) -> list[bytes]:
        """One piece's bytes as received; `_DirectReadFailed` unless all of it came with no pause over `timeout`.
        A blobnode that cannot be reached or answers too slowly is not asked again for `DIRECT_PAUSE` seconds: the
        plans that need it are read through access from its first piece on. Straight on aiohttp: httpx's work per
        request, a dozen times per 16 MiB, cost more than the access relay it replaces."""
        blobnode = urlsplit(piece.url).netloc
        if self._unreachable.get(blobnode, 0.0) > time.monotonic():
            raise _DirectReadFailed(f"{blobnode} did not answer lately")
        if self._shards is None:
            self._shards = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._trusted or True),
                                                 auto_decompress=False)
        try:
            async with self._shards.get(yarl.URL(piece.url, encoded=True), headers=piece.headers,
                                        timeout=aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout)
                                        ) as response:
                if response.status != 200:
                    raise _DirectReadFailed(f"{piece.url[:64]}: {response.status}")
                received = [part async for part in response.content.iter_any()]
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._unreachable[blobnode] = time.monotonic() + DIRECT_PAUSE
            raise _DirectReadFailed(f"{piece.url[:64]}: {type(exc).__name__}") from exc
        if sum(len(part) for part in received) != piece.size:
            raise _DirectReadFailed(f"{piece.url[:64]}: not {piece.size} bytes")
        return received

    def get_stream(self, location: str, offset: int = 0, size: int | None = None,
                   chunk_size: int | None = CHUNK) -> AsyncGenerator[bytes, None]:
        """The object's bytes (or `size` bytes from `offset`) piece by piece, never held whole: pieces of
        `chunk_size` bytes (the last one shorter), or with None as they come off the network, which spares
        re-cutting them (a copy of every byte)."""
        return self._download(location, offset, size, chunk_size, None)

    async def get(self, location: str, offset: int = 0, size: int | None = None) -> bytes:
        return b"".join([piece async for piece in self._download(location, offset, size, None, None)])

    async def get_to_file(self, location: str, path: str | os.PathLike[str], progress: Progress | None = None, *,
                          offset: int = 0, size: int | None = None) -> int:
        """Download into `path` (through `path.part`, renamed once complete); returns the bytes written."""
        target = Path(path)
        partial = target.with_name(target.name + ".part")
        written = 0
        try:
            with open(partial, "wb") as f:
                async for piece in self._download(location, offset, size, CHUNK, progress):
                    await asyncio.to_thread(f.write, piece)
                    written += len(piece)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        return written

    async def stat(self, location: str) -> Stat:
        async with self._exchange("GET", _blob_path(location) + "/stat") as response:
            await response.aread()
        return Stat.model_validate_json(response.content)

    async def delete(self, location: str) -> None:
        async with self._exchange("DELETE", _blob_path(location)):
            pass

    async def undelete(self, location: str) -> UndeleteResult:
        """Take back the DELETE of the object at `location` within its safe delay: it reads back, whole or with its
        lost shards being repaired (`degraded`); an object never deleted comes back as it was. After the delay:
        `NotFound` (code "purged"). Signed with the client's `grant`."""
        _blob_path(location)  # refused here if it is not a location token
        request = UndeleteRequest(location=location).model_dump_json().encode()
        headers = {"content-length": str(len(request)), "content-type": "application/json"}
        async with self._exchange("POST", "/undelete", headers, _Upload(request, None, None), signed=request) as answer:
            await answer.aread()
        return UndeleteResult.model_validate_json(answer.content)


class _LoopThread:
    """A private event loop in a daemon thread, so blocking callers can drive the async core."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="blobstore-client", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, agen: AsyncGenerator[T, None]) -> Iterator[T]:
        sentinel = object()

        async def step() -> object:
            return await anext(agen, sentinel)

        try:
            while (item := self.run(step())) is not sentinel:
                yield item  # type: ignore[misc]
        finally:
            if not self.loop.is_closed():
                self.run(agen.aclose())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Client:
    """Blocking access client with the same methods as `AsyncClient`; thread-safe.

    Progress callbacks run on the client's own I/O thread.
    """

    def __init__(self, hosts: str | Iterable[str], *, timeout: float = 60.0, connect_timeout: float = 3.0,
                 direct_reads: bool = True, keep_freed_memory: bool = True, grant: str | None = None,
                 ca: str | os.PathLike[str] | None = None) -> None:
        self._core = AsyncClient(hosts, timeout=timeout, connect_timeout=connect_timeout, direct_reads=direct_reads,
                                 keep_freed_memory=keep_freed_memory, grant=grant, ca=ca)
        self._loop = _LoopThread()

    @property
    def hosts(self) -> list[str]:
        return self._core.hosts

    def close(self) -> None:
        self._loop.run(self._core.aclose())
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, data: Data, *, size: int | None = None, code_mode: str | None = None,
            progress: Progress | None = None, parallel: int = 1, upload: Upload | None = None) -> str:
        return self._loop.run(self._core.put(data, size=size, code_mode=code_mode, progress=progress,
                                             parallel=parallel, upload=upload))

    def alloc(self, size: int, code_mode: str | None = None) -> Upload:
        return self._loop.run(self._core.alloc(size, code_mode))

    def put_part(self, upload: Upload, index: int, data: bytes) -> None:
        self._loop.run(self._core.put_part(upload, index, data))

    def get(self, location: str, offset: int = 0, size: int | None = None) -> bytes:
        return self._loop.run(self._core.get(location, offset, size))

    def get_stream(self, location: str, offset: int = 0, size: int | None = None,
                   chunk_size: int | None = CHUNK) -> Iterator[bytes]:
        return self._loop.iterate(self._core.get_stream(location, offset, size, chunk_size))

    def get_to_file(self, location: str, path: str | os.PathLike[str], progress: Progress | None = None, *,
                    offset: int = 0, size: int | None = None) -> int:
        return self._loop.run(self._core.get_to_file(location, path, progress, offset=offset, size=size))

    def stat(self, location: str) -> Stat:
        return self._loop.run(self._core.stat(location))

    def delete(self, location: str) -> None:
        self._loop.run(self._core.delete(location))

    def undelete(self, location: str) -> UndeleteResult:
        return self._loop.run(self._core.undelete(location))

