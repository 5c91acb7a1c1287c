import os
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from blobstore_server.libs.ec import (
    BACKENDS,
    DEFAULT_BACKEND,
    MAX_BLOB_SIZE,
    BackendMismatch,
    BlobTooLarge,
    Codec,
    CodeMode,
    ECError,
    NotEnoughShards,
    ShardCountMismatch,
    ShardSizeMismatch,
    UnknownBackend,
    UnknownCodeMode,
    tactic,
)
from blobstore_server.libs.ec.gf256 import MUL
from blobstore_server.libs.ec.isal import _lib, library_path

MiB = 1024 * 1024


def blob(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(CodeMode), ids=lambda m: m.name)
def test_every_mode_round_trips_with_m_losses(mode: CodeMode, backend: str) -> None:
    codec = Codec(mode, backend)
    t = codec.tactic
    data = blob(3 * t.n * 2048 + 17, seed=mode)
    shards = codec.encode(data)
    assert len(shards) == t.total
    assert {len(s) for s in shards} == {t.shard_size(len(data))}
    assert codec.decode(shards, len(data)) == data
    lossy = list(shards)
    for i in random.Random(mode).sample(range(t.n + t.m), t.m):
        lossy[i] = None
    assert codec.decode(lossy, len(data)) == data
    missing = [i for i, s in enumerate(lossy) if s is None]
    rebuilt = codec.reconstruct(lossy, missing)
    assert {i: bytes(s) for i, s in rebuilt.items()} == {i: bytes(shards[i]) for i in missing}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [CodeMode.EC6P3, CodeMode.EC6P10L2], ids=lambda m: m.name)
@pytest.mark.parametrize("size_of", [
    lambda t: 0, lambda t: 1, lambda t: t.n * 2048 - 1, lambda t: t.n * 2048,
    lambda t: t.n * 2048 + 1, lambda t: 4 * MiB,
])
def test_sizes(mode: CodeMode, backend: str, size_of: object) -> None:
    codec = Codec(mode, backend)
    size = size_of(codec.tactic)  # type: ignore[operator]
    data = blob(size, seed=size)
    shards = codec.encode(data)
    s = codec.tactic.shard_size(size)
    assert all(len(x) == s for x in shards)
    # zero padding: the bytes past the blob inside the data shards are zero
    assert b"".join(bytes(x) for x in shards[: codec.tactic.n])[size:] == bytes(codec.tactic.n * s - size)
    lossy: list[memoryview | None] = list(shards)
    lossy[0] = lossy[codec.tactic.n - 1] = None
    assert codec.decode(lossy, size) == data


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_blob_32mib(backend: str) -> None:
    codec = Codec(CodeMode.EC6P3, backend)
    data = os.urandom(MAX_BLOB_SIZE)
    shards = codec.encode(data)
    lossy: list[memoryview | None] = list(shards)
    lossy[1] = lossy[2] = lossy[5] = None
    assert codec.decode(lossy, len(data)) == data
    with pytest.raises(BlobTooLarge, match="exceeds"):
        codec.encode(data + b"x")


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_input_kinds_and_no_aliasing_of_mutable_input(kind: type) -> None:
    codec = Codec(CodeMode.EC6P3)
    data = blob(50_000)
    buf = bytearray(data)
    arg = kind(buf) if kind is not bytearray else buf
    shards = [bytes(s) for s in codec.encode(arg)]
    assert codec.decode(shards, len(data)) == data
    mutable_shards = codec.encode(buf)
    buf[:10] = b"\xff" * 10
    assert codec.decode(mutable_shards, len(data)) == data


def test_default_backend_and_backends_differ() -> None:
    assert DEFAULT_BACKEND == "isal"
    assert Codec(CodeMode.EC6P3).backend == "isal"
    data = blob(6 * 4096)
    isal, zfec = Codec(CodeMode.EC6P3, "isal").encode(data), Codec(CodeMode.EC6P3, "zfec").encode(data)
    assert [bytes(x) for x in isal[:6]] == [bytes(x) for x in zfec[:6]]
    assert [bytes(x) for x in isal[6:]] != [bytes(x) for x in zfec[6:]]


def test_backend_mismatch_is_refused() -> None:
    data = blob(10_000)
    shards = Codec(CodeMode.EC6P3, "zfec").encode(data)
    isal = Codec(CodeMode.EC6P3, "isal")
    with pytest.raises(BackendMismatch, match=r"'zfec'.*'isal'"):
        isal.decode(shards, len(data), encoded_with="zfec")
    with pytest.raises(BackendMismatch):
        isal.reconstruct(shards, [0], encoded_with="zfec")
    assert Codec(CodeMode.EC6P3, backend="zfec").decode(shards, len(data), encoded_with="zfec") == data


def test_unknown_backend() -> None:
    with pytest.raises(UnknownBackend, match="supported: isal, zfec"):
        Codec(CodeMode.EC6P3, "jerasure")


def test_not_enough_shards_says_present_and_needed() -> None:
    codec = Codec(CodeMode.EC6P3)
    data = blob(20_000)
    shards: list[memoryview | None] = list(codec.encode(data))
    shards[0] = shards[1] = shards[2] = shards[3] = None
    with pytest.raises(NotEnoughShards, match=r"EC6P3: 5 of 9 shards present, need 6") as info:
        codec.decode(shards, len(data))
    assert (info.value.present, info.value.needed) == (5, 6)
    with pytest.raises(NotEnoughShards):
        codec.reconstruct(shards, [0])
    with pytest.raises(NotEnoughShards):
        codec.reconstruct([None] * 9, [0])
    lrc = Codec(CodeMode.EC4P4L2)
    lrc_shards: list[memoryview | None] = list(lrc.encode(data))
    for i in (0, 1, 2, 4, 6):
        lrc_shards[i] = None
    with pytest.raises(NotEnoughShards, match="3 of the 8 global shards usable after local repair, need 4"):
        lrc.decode(lrc_shards, len(data))


def test_shard_length_and_count_errors() -> None:
    codec = Codec(CodeMode.EC6P3)
    data = blob(20_000)
    shards = [bytes(s) for s in codec.encode(data)]
    bad = list(shards)
    bad[4] = bad[4][:-1]
    with pytest.raises(ShardSizeMismatch, match="differ in length"):
        codec.decode(bad, len(data))
    with pytest.raises(ShardSizeMismatch, match="differ in length"):
        codec.reconstruct(bad, [0])
    with pytest.raises(ShardSizeMismatch, match="a 40000-byte blob has 6667-byte shards"):
        codec.decode(shards, 40_000)
    with pytest.raises(ShardCountMismatch, match="9 shards per stripe, got 8"):
        codec.decode(shards[:8], len(data))
    with pytest.raises(ECError, match=r"outside 0\.\.8"):
        codec.reconstruct(shards, [9])
    with pytest.raises(BlobTooLarge):
        codec.decode(shards, MAX_BLOB_SIZE + 1)
    assert all(issubclass(e, ECError) and issubclass(e, ValueError) for e in (
        UnknownCodeMode, UnknownBackend, NotEnoughShards, ShardSizeMismatch, ShardCountMismatch,
        BackendMismatch, BlobTooLarge))


def test_reconstruct_ignores_contents_of_wanted_shards() -> None:
    codec = Codec(CodeMode.EC6P3)
    shards = [bytes(s) for s in codec.encode(blob(30_000))]
    corrupt = list(shards)
    corrupt[2] = bytes(len(shards[2]))
    assert bytes(codec.reconstruct(corrupt, [2])[2]) == shards[2]


class _NoGlobal:
    name = "isal"

    def encode_into(self, *args: object) -> None:
        raise AssertionError("global code used")

    rebuild_into = encode_into


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", [CodeMode.EC6P10L2, CodeMode.EC4P4L2, CodeMode.EC6P3L3, CodeMode.EC16P20L2],
                         ids=lambda m: m.name)
def test_lrc_single_loss_uses_only_its_local_stripe(mode: CodeMode, backend: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    codec = Codec(mode, backend)
    data = blob(codec.tactic.n * 3000)
    shards = codec.encode(data)
    monkeypatch.setattr(codec, "_rs", _NoGlobal())
    for stripe in codec.tactic.local_stripes():
        for lost in stripe:
            only_stripe = [shards[i] if i in stripe and i != lost else None for i in range(codec.tactic.total)]
            assert bytes(codec.reconstruct(only_stripe, [lost])[lost]) == bytes(shards[lost])
        # decode with one data shard lost in this stripe reads the stripe, not the global code
        lossy: list[memoryview | None] = list(shards)
        lossy[stripe[0]] = None
        assert codec.decode(lossy, len(data)) == data


def test_concurrent_encode_from_two_threads() -> None:
    codecs = {b: Codec(CodeMode.EC6P3, b) for b in BACKENDS}
    blobs = [blob(1 * MiB + i, seed=i) for i in range(8)]
    expected = {(b, i): [bytes(s) for s in codecs[b].encode(d)] for b in BACKENDS for i, d in enumerate(blobs)}

    def work(job: tuple[str, int]) -> bool:
        b, i = job
        return all(
            [bytes(s) for s in codecs[b].encode(blobs[i])] == expected[job] for _ in range(5)
        )

    with ThreadPoolExecutor(2) as pool:
        assert all(pool.map(work, list(expected) * 2))


def test_gf_table_matches_isal_and_library_is_found() -> None:
    rng = np.random.default_rng(1)
    for a, b in rng.integers(0, 256, size=(2000, 2)):
        assert MUL[a, b] == _lib().gf_mul(int(a), int(b))
    assert "isal" in os.path.basename(library_path())


def test_tactic_attribute() -> None:
    assert Codec(CodeMode.EC6P3).tactic == tactic(CodeMode.EC6P3)
    assert repr(Codec(CodeMode.EC6P3, "zfec")) == "Codec(EC6P3, backend='zfec')"
