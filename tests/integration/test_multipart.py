"""Multipart upload (POST /blob/alloc + PUT /blob/putat) on real processes, with the delete pipeline
that reclaims uploads never finished."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from blobstore import AsyncClient, Client, NotFound, Upload, UploadIncomplete
from blobstore_server.libs.proto.tinker import TinkerStats
from blobstore_server.libs.proto.uploads import BlobToken
from tests.support.load import wait_for_put
from tests.support.processes import SIGNED, LocalCluster, wait_until
from tests.support.shards import blobs_of, states

ClusterFactory = Callable[..., LocalCluster]
MiB = 1 << 20
BLOB = 1 * MiB  # small blobs: a 10 MiB object is ten parts


def _cluster(cluster_factory: ClusterFactory) -> LocalCluster:
    # Tokens live 15 s; a reclaim is due 2 shard timeouts (2 s) later.
    cluster = cluster_factory(pipelines=True, safe_delay=1.0, blob_size=BLOB, upload_ttl=15.0, shard_timeout=1.0)
    with httpx.Client(base_url=cluster.access[0].url, timeout=60) as client:
        wait_for_put(client, b"warm-up")
    return cluster


def _put_part(client: httpx.Client, token: str, data: bytes) -> httpx.Response:
    return client.put("/blob/putat", params={"token": token}, content=data)


def test_parts_in_reverse_and_in_parallel_read_back_and_bad_parts_change_nothing(
        cluster_factory: ClusterFactory) -> None:
    cluster = _cluster(cluster_factory)
    data = random.Random(5).randbytes(10 * MiB)
    url = cluster.access[0].url
    with Client(url) as sdk:
        upload = sdk.alloc(len(data))
    assert len(upload.tokens) == 10 and upload.blob_size == BLOB

    async def send(indexes: list[int]) -> None:
        async with AsyncClient(url) as client:
            await asyncio.gather(*(client.put_part(upload, i, data[i * BLOB:(i + 1) * BLOB]) for i in indexes))

    asyncio.run(send([9, 8, 7, 6, 5]))  # the second half, in reverse, five at once
    with Client(url) as sdk:
        assert sdk.get(upload.location, 9 * MiB, MiB) == data[9 * MiB:]
        with pytest.raises(NotFound, match="not uploaded yet"):
            sdk.get(upload.location, 0, 10)
    asyncio.run(send([4, 3, 2, 1, 0]))

    with httpx.Client(base_url=url, timeout=60) as client:
        first = data[:BLOB]
        altered = upload.tokens[0][:-2] + ("AA" if upload.tokens[0][-2:] != "AA" else "BB")
        forged = _put_part(client, altered, first)
        assert forged.status_code in (400, 403), forged.text
        expired = BlobToken.from_token(upload.tokens[0], LocalCluster.secret.encode(), time.time())
        stale = BlobToken(expired.cluster_id, expired.vid, expired.bid, expired.size, int(time.time()) - 1)
        refused = _put_part(client, stale.to_token(LocalCluster.secret.encode()), first)
        assert refused.status_code == 403 and "expired" in refused.text
        short = _put_part(client, upload.tokens[0], first[:-1])
        assert short.status_code == 400 and "holds" in short.text, short.text
        other = _put_part(client, upload.tokens[0], bytes(BLOB))
        assert other.status_code == 409 and "other bytes" in other.text, other.text
        again = _put_part(client, upload.tokens[0], first)
        assert again.status_code == 200, again.text  # the same bytes again: harmless
        assert client.get(f"/blob/{upload.location}").content == data  # nothing refused changed a byte


def _reclaims_done(cluster: LocalCluster) -> int:
    answer = httpx.get(f"{cluster.background['tinker'].url}/stats", timeout=30, auth=SIGNED)
    return TinkerStats.model_validate_json(answer.content).pipelines["reclaim"].done


def interrupted_body(data: bytes, stop_after: int) -> Iterator[bytes]:
    yield data[:stop_after]
    raise ConnectionError("the source went away")


def test_an_interrupted_upload_resumes_elsewhere_and_an_unfinished_one_is_reclaimed(
        cluster_factory: ClusterFactory) -> None:
    cluster = _cluster(cluster_factory)
    data = random.Random(6).randbytes(6 * MiB)
    with Client(cluster.access[0].url) as sdk, pytest.raises(UploadIncomplete) as failed:
        sdk.put(interrupted_body(data, 3 * MiB + 10), size=len(data), parallel=2)
    upload: Upload = failed.value.upload
    assert upload.done == {0, 1, 2}
    cluster.access[0].kill9()  # the access node that took the first parts is gone too
    second = cluster.add_access()
    with Client(second.url) as sdk:
        assert sdk.put(data, parallel=3, upload=upload) == upload.location
        assert sdk.get(upload.location) == data
        abandoned = sdk.alloc(3 * MiB)
        sdk.put_part(abandoned, 1, b"x" * MiB)
    # Past the tokens' expiry both reclaims come due: the unfinished upload goes, the finished one stays.
    (vid, bid) = blobs_of(cluster, abandoned.location)[1]
    wait_until(lambda: all(s in ("mark_deleted", "missing") for s in states(cluster, vid, bid)), 60,
               "the abandoned upload's part deleted", interval=0.5)
    wait_until(lambda: _reclaims_done(cluster) == 2, 30, "tinker done with both uploads' reclaims", interval=0.2)
    with Client(second.url) as sdk:
        assert sdk.get(upload.location) == data
    sent = [json.loads(line) for line in (second.workdir.parent / "access1-audit.jsonl").read_text().splitlines()]
    assert sum(e["path"] == "/blob/putat" for e in sent) == 4  # parts 3, 4, 5 of the first upload, 1 of the other
