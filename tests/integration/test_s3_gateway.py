"""The S3 gateway in front of a real cluster, driven by boto3 as users drive it: buckets, objects streamed in
and out (several Locations each), ranges, conditionals, errors in S3's terms, owners, and the garbage an
overwrite leaves reaped through access."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import boto3.s3.transfer
import httpx
import pytest
from botocore.exceptions import ClientError

from blobstore_server.services.s3.namespace import open_namespace
from tests.support.load import wait_deleted
from tests.support.processes import LocalCluster
from tests.support.s3 import NAMESPACE_ENGINES, Gateway, new_namespace, running_gateway


@pytest.fixture(scope="module", params=NAMESPACE_ENGINES)
def gateway(request: pytest.FixtureRequest, shared_cluster: LocalCluster,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway on the module's cluster for each namespace engine: each test makes its own users and buckets."""
    namespace = new_namespace(request.param, request)
    with running_gateway(shared_cluster, tmp_path_factory.mktemp("s3"), namespace, domains=[DOMAIN]) as started:
        yield started


DOMAIN = "s3.test"  # the gateway's virtual-hosted style domain: `<bucket>.s3.test`


@pytest.fixture
def wildcard_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """`s3.test` and every name under it resolve to 127.0.0.1 in this test process, as a wildcard DNS record would
    (a stand-in for DNS, which this machine has not; the gateway and the clients' requests are real)."""
    resolve = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        named = isinstance(host, str) and (host == DOMAIN or host.endswith("." + DOMAIN))
        return resolve("127.0.0.1" if named else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def name() -> str:
    """A user or bucket name of its own for each test (they share one gateway)."""
    return f"t{os.urandom(4).hex()}"


def _code(exc: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    return exc.value.response["ResponseMetadata"]["HTTPStatusCode"], exc.value.response["Error"]["Code"]


def test_objects_round_trip_through_boto3(gateway: Gateway) -> None:
    s3 = gateway.client(*gateway.user(name()))
    bucket = name()
    s3.create_bucket(Bucket=bucket)
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [bucket]
    s3.head_bucket(Bucket=bucket)
    body = os.urandom(3 * (1 << 20) + 12345)  # three Locations and a tail
    put = s3.put_object(Bucket=bucket, Key="2026/a b+€.jpg", Body=body, ContentType="image/jpeg",
                        Metadata={"camera": "x100"})
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="2026/a b+€.jpg")
    assert got["Body"].read() == body and got["ContentType"] == "image/jpeg"
    assert got["Metadata"] == {"camera": "x100"} and got["ETag"] == put["ETag"]
    part = s3.get_object(Bucket=bucket, Key="2026/a b+€.jpg", Range="bytes=1048570-2097160")
    assert part["Body"].read() == body[1048570:2097161] and part["ContentRange"] == f"bytes 1048570-2097160/{len(body)}"
    head = s3.head_object(Bucket=bucket, Key="2026/a b+€.jpg")
    assert head["ContentLength"] == len(body)
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="2026/a b+€.jpg", IfNoneMatch=put["ETag"])
    assert _code(err)[0] == 304 and err.value.response["ResponseMetadata"]["HTTPHeaders"]["etag"] == put["ETag"]
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket=bucket, Key="empty", Body=b"x", IfNoneMatch="*")
    assert _code(err) == (412, "PreconditionFailed")
    s3.delete_object(Bucket=bucket, Key="2026/a b+€.jpg")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key="2026/a b+€.jpg")
    assert _code(err) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as err:
        s3.delete_bucket(Bucket=bucket)
    assert _code(err) == (409, "BucketNotEmpty")


def test_strangers_and_bad_signatures_are_refused(gateway: Gateway) -> None:
    alice_key, alice_secret = gateway.user(name())
    alice, bob = gateway.client(alice_key, alice_secret), gateway.client(*gateway.user(name()))
    bucket = name()
    alice.create_bucket(Bucket=bucket)
    alice.put_object(Bucket=bucket, Key="k", Body=b"secret")
    for call in (lambda: bob.get_object(Bucket=bucket, Key="k"), lambda: bob.put_object(Bucket=bucket, Key="k",
                                                                                           Body=b"mine")):
        with pytest.raises(ClientError) as err:
            call()
        assert _code(err) == (403, "AccessDenied")
    with pytest.raises(ClientError) as err:
        bob.create_bucket(Bucket=bucket)
    assert _code(err) == (409, "BucketAlreadyExists")
    forged = gateway.client(alice_key, "x" * 40)
    with pytest.raises(ClientError) as err:
        forged.get_object(Bucket=bucket, Key="k")
    assert _code(err) == (403, "SignatureDoesNotMatch")
    with pytest.raises(ClientError) as err:
        gateway.client("AKNOBODY", "x" * 40).list_buckets()
    assert _code(err) == (403, "InvalidAccessKeyId")
    assert alice.get_object(Bucket=bucket, Key="k")["Body"].read() == b"secret"


def test_an_overwrite_leaves_its_old_blobs_to_the_reaper(cluster_factory: Callable[..., LocalCluster],
                                                          tmp_path: Path) -> None:
    """The gateway's reaper deletes through access, which takes a DELETE only with Kafka behind it: a cluster with
    its pipelines, its own."""
    with running_gateway(cluster_factory(pipelines=True, clustermgrs=1, safe_delay=1.0), tmp_path) as gateway:
        _overwrite_and_reap(gateway)


def _overwrite_and_reap(gateway: Gateway) -> None:
    s3 = gateway.client(*gateway.user(name()))
    bucket = name()
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="k", Body=os.urandom(2 << 20))
    store = open_namespace(gateway.namespace)
    try:
        old = [e.location for e in store.get_object(bucket, b"k").manifest]
    finally:
        store.close()
    assert len(old) == 2
    new = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="k", Body=new)

    wait_deleted(gateway.cluster.access[0].url, old, 30, "the overwritten object's blobs deleted")
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == new


def test_listing_v1_and_v2_with_prefixes_delimiters_and_pages(gateway: Gateway) -> None:
    s3 = gateway.client(*gateway.user(name()))
    bucket = name()
    s3.create_bucket(Bucket=bucket)
    keys = ["a/1", "a/2", "a/b/3", "b", "foo+1/x", "foo/x", "z€"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == sorted(keys, key=str.encode) and listed["KeyCount"] == 7
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "foo+1/", "foo/"]
    assert [o["Key"] for o in top["Contents"]] == ["b", "z€"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="a/", Delimiter="/")["Contents"]] == \
        ["a/1", "a/2"]
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2})
    assert [o["Key"] for page in pages for o in page.get("Contents", [])] == sorted(keys, key=str.encode)
    v1 = s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 3})
    assert [o["Key"] for page in v1 for o in page.get("Contents", [])] == sorted(keys, key=str.encode)
    # botocore decodes only what it asked to be encoded itself: asked by its caller, keys come back encoded
    assert [o["Key"] for o in s3.list_objects(Bucket=bucket, EncodingType="url")["Contents"]] == \
        [quote(k, safe="/~") for k in sorted(keys, key=str.encode)]
    deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:3]]})
    assert sorted(d["Key"] for d in deleted["Deleted"]) == keys[:3]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == sorted(keys[3:], key=str.encode)


def test_multipart_copy_and_presigned_urls(gateway: Gateway, tmp_path: Path) -> None:
    keys = gateway.user(name())
    s3 = gateway.client(*keys)
    bucket = name()
    s3.create_bucket(Bucket=bucket)
    data = os.urandom(13 * (1 << 20) + 7)
    source = tmp_path / "big"
    source.write_bytes(data)
    transfer = boto3.s3.transfer.TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    s3.upload_file(str(source), bucket, "big", Config=transfer)
    head = s3.head_object(Bucket=bucket, Key="big")
    assert head["ContentLength"] == len(data) and head["ETag"].endswith('-3"')
    assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == data
    assert s3.get_object(Bucket=bucket, Key="big", Range="bytes=5242870-5242890")["Body"].read() == \
        data[5242870:5242891]
    # one part at a time, as parallel downloaders read a multipart object
    part = s3.get_object(Bucket=bucket, Key="big", PartNumber=3)
    assert part["Body"].read() == data[10 << 20:] and part["PartsCount"] == 3
    assert (part["ContentRange"], part["ETag"]) == (f"bytes {10 << 20}-{len(data) - 1}/{len(data)}", head["ETag"])
    head_part = s3.head_object(Bucket=bucket, Key="big", PartNumber=2)
    assert (head_part["ContentLength"], head_part["PartsCount"]) == (5 << 20, 3)
    assert head_part["ResponseMetadata"]["HTTPStatusCode"] == 206
    for refused, expected in (({"PartNumber": 4}, (416, "InvalidPartNumber")),
                              ({"PartNumber": 1, "Range": "bytes=0-1"}, (400, "InvalidRequest"))):
        with pytest.raises(ClientError) as err:
            s3.get_object(Bucket=bucket, Key="big", **refused)
        assert _code(err) == expected
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "big"})
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == data
    assert "ChecksumCRC32" not in s3.head_object(Bucket=bucket, Key="copy", ChecksumMode="ENABLED")  # not "...-3"
    whole = s3.get_object(Bucket=bucket, Key="copy", PartNumber=1)  # a copy is one part, its only one
    assert whole["Body"].read() == data and "PartsCount" not in whole
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "copy"},
                   MetadataDirective="REPLACE", Metadata={"k": "v"}, ContentType="text/plain")
    replaced = s3.get_object(Bucket=bucket, Key="copy")
    assert replaced["Metadata"] == {"k": "v"} and replaced["ContentType"] == "text/plain"
    upload = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [upload]
    s3.upload_part(Bucket=bucket, Key="parts", UploadId=upload, PartNumber=1, Body=b"x" * 10)
    with pytest.raises(ClientError) as err:
        s3.upload_part(Bucket=bucket, Key="other", UploadId=upload, PartNumber=1, Body=b"y")
    assert _code(err) == (404, "NoSuchUpload")
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]})
    assert _code(err) == (400, "InvalidPart")
    s3.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    v2 = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "copy"}, ExpiresIn=60)
    assert "Signature=" in v2 and httpx.get(v2).content == data  # boto3 presigns with signature version 2 unless told
    s3 = gateway.client(*keys, signature_version="s3v4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "copy"}, ExpiresIn=60)
    got = httpx.get(url)
    assert got.content == data, got.content[:400]
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"}, ExpiresIn=60)
    assert httpx.put(put_url, content=b"presigned").status_code == 200
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"presigned"
    tampered = url.replace("copy", "big")
    denied = httpx.get(tampered)
    assert denied.status_code == 403 and b"SignatureDoesNotMatch" in denied.content


def test_virtual_hosted_style_names_the_bucket_in_the_host(gateway: Gateway, wildcard_dns: None) -> None:
    keys = gateway.user(name())
    endpoint = f"http://{DOMAIN}:{gateway.url.rsplit(':', 1)[1]}"
    s3 = gateway.client(*keys, endpoint=endpoint, addressing="virtual", signature_version="s3v4")
    bucket = name()
    s3.create_bucket(Bucket=bucket)
    put = s3.put_object(Bucket=bucket, Key="dir/a b+€", Body=b"hosted")
    assert put["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    got = s3.get_object(Bucket=bucket, Key="dir/a b+€")
    assert got["Body"].read() == b"hosted" and got["ETag"] == put["ETag"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["dir/a b+€"]
    # what boto3 sent: the bucket in the Host, not in the path
    sent = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "dir/a b+€"}, ExpiresIn=60)
    assert sent.startswith(f"http://{bucket}.{DOMAIN}:") and f"/{bucket}/" not in sent
    assert httpx.get(sent).content == b"hosted"
    v2 = gateway.client(*keys, endpoint=endpoint, addressing="virtual")  # presigned with signature version 2
    legacy = v2.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "dir/a b+€"}, ExpiresIn=60)
    assert "Signature=" in legacy and httpx.get(legacy).content == b"hosted"
    # path style on the same domain, and the bucket named twice is a key in it
    assert gateway.client(*keys, endpoint=endpoint).get_object(Bucket=bucket, Key="dir/a b+€")["Body"].read() == \
        b"hosted"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=bucket, Key=f"{bucket}/dir/a b+€")
    assert _code(err) == (404, "NoSuchKey")
    with pytest.raises(ClientError) as err:  # another user's bucket, by its host name
        gateway.client(*gateway.user(name()), endpoint=endpoint, addressing="virtual").get_object(
            Bucket=bucket, Key="dir/a b+€")
    assert _code(err) == (403, "AccessDenied")
