"""The S3 namespace store on both of its engines, a real SQLite file and a real PostgreSQL server: every operation
and every S3 error it answers, the GC outbox after each way an object's blobs are orphaned, conditions that fail
changing nothing, strong read-after-write between store objects, writers racing on one key, bytewise key order,
and the time a page of 1000 takes out of 100,000 keys.

The `opener` fixture is the only place that knows the backend; the tests at the end are each engine's own."""

from __future__ import annotations

import hashlib
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from blobstore_server.services.s3.errors import S3Error
from blobstore_server.services.s3.namespace import (
    POSTGRESQL,
    SQLITE,
    Credentials,
    Extent,
    IfMatch,
    IfNoneMatch,
    NamespaceStore,
    NoSuchUser,
    ObjectMeta,
    ObjectRecord,
    UserExists,
    open_namespace,
    postgres_connect,
    sqlite_connect,
)
from blobstore_server.services.s3.namespace.base import encode_manifest, encode_meta

GC_DELAY_MS = 60_000
MiB = 1024 * 1024
TABLES = ("users", "buckets", "objects", "intents", "intent_extents", "uploads", "parts", "gc")


@dataclass
class Clock:
    now: int = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


Opener = Callable[[], NamespaceStore]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["sqlite", "postgresql"])
def opener(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Opener]:
    """Opens store objects on one database of the backend under test: a SQLite file, or a schema of the test's own
    on the session's PostgreSQL server."""
    spec = str(tmp_path / "namespace.db") if request.param == "sqlite" else request.getfixturevalue("postgres_dsn")
    opened: list[NamespaceStore] = []

    def open_store() -> NamespaceStore:
        store = open_namespace(spec, gc_delay_ms=GC_DELAY_MS, clock=clock)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(opener: Opener) -> NamespaceStore:
    store = opener()
    store.create_bucket("photos", "alice")
    return store


def put(store: NamespaceStore, key: bytes, locations: list[str], bucket: str = "photos", etag: str = "",
        condition: IfMatch | IfNoneMatch | None = None, size_each: int = 100) -> ObjectRecord:
    """A PUT as the gateway makes it: an intent, a blob recorded after each write but the last, which the commit
    records (the gateway holds a body's short last segment so)."""
    intent = store.begin_intent(store.get_bucket(bucket), key)
    manifest = tuple(Extent(i * size_each, size_each, loc) for i, loc in enumerate(locations))
    for extent in manifest[:-1]:
        store.add_intent_extent(intent, extent)
    intent.pending.extend(e.location for e in manifest[-1:])
    record = ObjectRecord(key, size_each * len(locations), etag or hashlib.md5(key).hexdigest(), store.clock(),
                          ObjectMeta(content_type="image/jpeg", cache_control="no-cache",
                                     metadata={"camera": "x100"}), {"crc32": "AAAAAA=="}, None, manifest)
    store.commit_object(bucket, record, intent, condition)
    return record


def garbage(store: NamespaceStore) -> set[str]:
    """Every location in the GC outbox, due or not."""
    return {g.location for g in store.due_garbage(10_000, now_ms=store.clock() + 10 * GC_DELAY_MS)}


def dump(store: NamespaceStore) -> dict[str, list[tuple[Any, ...]]]:
    with store.transaction(write=False) as tx:
        return {table: sorted(tx.all(f"SELECT * FROM {table}"), key=repr) for table in TABLES}


def s3_error(code: str) -> Any:
    return pytest.raises(S3Error, match=f"^{code}:")


# users ---------------------------------------------------------------------------------------------------------


def test_users_get_aws_shaped_keys_and_secrets_found_by_access_key(opener: Opener) -> None:
    store = opener()
    key, secret = store.add_user("bob")
    key2, secret2 = store.add_user("alice")
    assert len(key) == 20 and key.isalnum() and key.isupper() and len(secret) == 40
    assert key != key2 and secret != secret2
    assert store.credentials(key) == Credentials(store.list_users()[1], secret)
    assert store.credentials("AKNOTAKEY") is None
    assert [(u.name, u.access_key) for u in store.list_users()] == [("alice", key2), ("bob", key)]
    assert [c.user.name if c else None for c in map(store.credentials, (key2, key))] == ["alice", "bob"]
    with pytest.raises(UserExists):
        store.add_user("bob")
    store.remove_user("bob")
    assert store.credentials(key) is None and [u.name for u in store.list_users()] == ["alice"]
    with pytest.raises(NoSuchUser):
        store.remove_user("bob")


def test_a_service_user_is_set_up_with_its_keys_and_buckets_by_every_gateway_start(opener: Opener) -> None:
    store = opener()
    store.ensure_user("inspect", "AKSERVICEUSER0000001", "s" * 64, ["exports"])
    store.ensure_user("inspect", "AKSERVICEUSER0000001", "s" * 64, ["exports"])  # the next start, or a second gateway
    credentials = store.credentials("AKSERVICEUSER0000001")
    assert credentials is not None and (credentials.user.name, credentials.secret) == ("inspect", "s" * 64)
    assert [(b.name, b.owner) for b in store.list_buckets("inspect")] == [("exports", "inspect")]
    store.ensure_user("inspect", "AKSERVICEUSER0000002", "t" * 64)  # a new cluster secret: new keys, same buckets
    assert store.credentials("AKSERVICEUSER0000001") is None
    assert [u.name for u in store.list_users()] == ["inspect"] and len(store.list_buckets("inspect")) == 1
    store.add_user("mallory")
    store.create_bucket("taken", "mallory")
    with pytest.raises(S3Error, match="BucketAlreadyExists"):  # a gateway will not start on another's bucket
        store.ensure_user("inspect", "AKSERVICEUSER0000002", "t" * 64, ["taken"])
    assert [b.name for b in store.list_buckets("inspect")] == ["exports"]


# buckets -------------------------------------------------------------------------------------------------------


def test_buckets_are_listed_by_owner_in_name_order(opener: Opener) -> None:
    store = opener()
    for name, owner in [("zeta", "alice"), ("alpha", "alice"), ("mid.dle-1", "alice"), ("other", "bob")]:
        store.create_bucket(name, owner)
    assert [b.name for b in store.list_buckets("alice")] == ["alpha", "mid.dle-1", "zeta"]
    assert [b.name for b in store.list_buckets("bob")] == ["other"]
    assert store.get_bucket("zeta").owner == "alice"
    with s3_error("NoSuchBucket"):
        store.get_bucket("nope")


@pytest.mark.parametrize("name", ["ab", "a" * 64, "Upper", "under_score", "-start", "end-", "two..dots", "dot.-dash",
                                  "192.168.1.2", "xn--punycode", "sthree-x", "bucket-s3alias", "has space", ""])
def test_names_breaking_s3s_rules_are_refused(opener: Opener, name: str) -> None:
    with s3_error("InvalidBucketName"):
        opener().create_bucket(name, "alice")


@pytest.mark.parametrize("name", ["abc", "a" * 63, "my.bucket-1", "123", "a-b.c"])
def test_names_keeping_s3s_rules_are_taken(opener: Opener, name: str) -> None:
    assert opener().create_bucket(name, "alice").name == name


def test_a_taken_name_is_owned_by_you_or_already_exists(store: NamespaceStore) -> None:
    with s3_error("BucketAlreadyOwnedByYou"):
        store.create_bucket("photos", "alice")
    with s3_error("BucketAlreadyExists"):
        store.create_bucket("photos", "bob")
    assert [b.name for b in store.list_buckets("bob")] == []


def test_a_bucket_with_objects_is_not_deleted_one_with_only_uploads_is(store: NamespaceStore) -> None:
    put(store, b"k", ["loc-k"])
    with s3_error("BucketNotEmpty"):
        store.delete_bucket("photos")
    store.delete_object("photos", b"k")
    upload = store.create_upload("photos", b"big", "alice")
    store.put_part("photos", upload.id, 1, 5 * MiB, "aa" * 16, (Extent(0, 5 * MiB, "loc-part"),), None)
    intent = store.begin_intent(store.get_bucket("photos"), b"in-flight")
    store.add_intent_extent(intent, Extent(0, 10, "loc-in-flight"))
    store.delete_bucket("photos")
    assert garbage(store) == {"loc-k", "loc-part", "loc-in-flight"}
    with s3_error("NoSuchBucket"):
        store.list_objects("photos")
    with s3_error("NoSuchBucket"):
        store.delete_bucket("photos")
    store.create_bucket("photos", "bob")  # a new bucket: the in-flight PUT cannot land in it
    record = ObjectRecord(b"in-flight", 10, "ab" * 16, 0, manifest=(Extent(0, 10, "loc-in-flight"),))
    with s3_error("NoSuchBucket"):
        store.commit_object("photos", record, intent)


# objects -------------------------------------------------------------------------------------------------------


def test_an_object_reads_back_as_committed(store: NamespaceStore) -> None:
    record = put(store, "ключ/é".encode(), ["loc-1", "loc-2"])
    assert store.get_object("photos", "ключ/é".encode()) == record
    assert record.meta.metadata == {"camera": "x100"} and record.manifest[1] == Extent(100, 100, "loc-2")
    with s3_error("NoSuchKey"):
        store.get_object("photos", b"missing")
    with s3_error("NoSuchBucket"):
        store.get_object("nope", b"k")
    with s3_error("KeyTooLongError"):
        store.begin_intent(store.get_bucket("photos"), b"k" * 1025)


def test_an_object_with_no_blobs_commits_without_an_intent(store: NamespaceStore) -> None:
    store.commit_object("photos", ObjectRecord(b"empty", 0, "d41d8cd98f00b204e9800998ecf8427e", 5), None)
    assert store.get_object("photos", b"empty").size == 0


def test_overwrite_and_delete_send_the_old_blobs_to_gc_after_the_delay(store: NamespaceStore, clock: Clock) -> None:
    put(store, b"k", ["old-1", "old-2"])
    assert garbage(store) == set()
    put(store, b"k", ["new-1"])
    assert store.get_object("photos", b"k").manifest == (Extent(0, 100, "new-1"),)
    assert store.due_garbage(100) == []  # a GET that read the old manifest may still be reading
    clock.now += GC_DELAY_MS
    due = store.due_garbage(100)
    assert {g.location for g in due} == {"old-1", "old-2"}
    store.garbage_done(due[:1])
    assert {g.location for g in store.due_garbage(100)} == {due[1].location}
    assert store.delete_object("photos", b"k") is True
    assert store.delete_object("photos", b"k") is False
    assert garbage(store) == {due[1].location, "new-1"}
    with s3_error("NoSuchKey"):
        store.get_object("photos", b"k")


def test_a_self_copy_keeping_the_manifest_sends_nothing_to_gc(store: NamespaceStore) -> None:
    record = put(store, b"k", ["loc-1"])
    store.commit_object("photos", ObjectRecord(b"k", record.size, record.etag, 9, ObjectMeta("text/plain"), {}, None,
                                               record.manifest), None)
    assert store.get_object("photos", b"k").meta.content_type == "text/plain" and garbage(store) == set()


def test_delete_objects_deletes_up_to_1000_keys_in_one_go(store: NamespaceStore) -> None:
    for i in range(3):
        put(store, b"k%d" % i, [f"loc-{i}"])
    assert store.delete_objects("photos", [b"k0", b"k2", b"missing"]) == [b"k0", b"k2"]
    assert [o.key for o in store.list_objects("photos").objects] == [b"k1"]
    assert garbage(store) == {"loc-0", "loc-2"}
    with s3_error("MalformedXML"):
        store.delete_objects("photos", [b"k%d" % i for i in range(1001)])


def test_an_abandoned_put_sends_its_blobs_to_gc_and_leaves_no_object(store: NamespaceStore) -> None:
    intent = store.begin_intent(store.get_bucket("photos"), b"k")
    store.add_intent_extent(intent, Extent(0, 10, "loc-a"))
    store.add_intent_extent(intent, Extent(10, 10, "loc-b"))
    store.abandon_intent(intent)
    store.abandon_intent(intent)
    assert garbage(store) == {"loc-a", "loc-b"}
    assert store.list_objects("photos").objects == []


def test_conditional_puts(store: NamespaceStore) -> None:
    first = put(store, b"k", ["loc-1"], condition=IfNoneMatch())
    with s3_error("PreconditionFailed"):
        put(store, b"k", ["loc-2"], condition=IfNoneMatch())
    with s3_error("PreconditionFailed"):
        put(store, b"k", ["loc-3"], condition=IfMatch('"' + "0" * 32 + '"'))
    with s3_error("NoSuchKey"):
        put(store, b"other", ["loc-4"], condition=IfMatch(first.etag))
    put(store, b"k", ["loc-5"], etag="ee" * 16, condition=IfMatch(f'"{first.etag}"'))
    assert store.get_object("photos", b"k").etag == "ee" * 16
    assert garbage(store) == {"loc-1", "loc-2", "loc-3", "loc-4"}  # a refused commit sends its blobs to GC


def test_a_put_whose_condition_fails_leaves_the_object_and_sends_its_blobs_to_gc(store: NamespaceStore) -> None:
    put(store, b"k", ["loc-1"])
    before = store.get_object("photos", b"k")
    intent = store.begin_intent(store.get_bucket("photos"), b"k")
    store.add_intent_extent(intent, Extent(0, 100, "loc-2"))
    intent.pending.append("loc-3")
    record = ObjectRecord(b"k", 200, "ff" * 16, 1, manifest=(Extent(0, 100, "loc-2"), Extent(100, 100, "loc-3")))
    with s3_error("PreconditionFailed"):
        store.commit_object("photos", record, intent, IfNoneMatch())
    assert store.get_object("photos", b"k") == before
    assert garbage(store) == {"loc-2", "loc-3"} and not dump(store)["intents"]
    store.abandon_intent(intent)  # what the gateway does after any failure: nothing more to give up
    assert garbage(store) == {"loc-2", "loc-3"}


def test_a_one_blob_put_writes_once_its_commit_and_a_failed_one_gives_its_blob_to_gc(store: NamespaceStore) -> None:
    intent = store.begin_intent(store.get_bucket("photos"), b"k")
    intent.pending.append("loc-1")
    before = dump(store)
    store.abandon_intent(store.begin_intent(store.get_bucket("photos"), b"other"))  # held no blob: writes nothing
    assert dump(store) == before
    store.commit_object("photos", ObjectRecord(b"k", 10, "aa" * 16, 0, manifest=(Extent(0, 10, "loc-1"),)), intent)
    assert store.get_object("photos", b"k").manifest == (Extent(0, 10, "loc-1"),) and not dump(store)["intents"]
    failed = store.begin_intent(store.get_bucket("photos"), b"k2")
    failed.pending.append("loc-2")  # stored, then its digest did not match
    store.abandon_intent(failed)
    assert garbage(store) == {"loc-2"}


def test_a_write_is_read_and_listed_at_once_through_another_store_and_thread(opener: Opener) -> None:
    writer, reader = opener(), opener()
    writer.create_bucket("shared", "alice")
    seen: list[object] = []
    for i in range(20):
        put(writer, b"k%02d" % i, [f"loc-{i}"], bucket="shared")

        def read(i: int = i) -> None:
            seen.append(reader.get_object("shared", b"k%02d" % i).manifest[0].location)
            seen.append(len(reader.list_objects("shared").objects))

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()
        assert seen[-2:] == [f"loc-{i}", 1]
        writer.delete_object("shared", b"k%02d" % i)
        assert reader.list_objects("shared", after=b"k%02d" % (i - 1) if i else None).objects == []


# listing -------------------------------------------------------------------------------------------------------


def test_keys_list_in_bytewise_order(store: NamespaceStore) -> None:
    keys = [b"foo/", b"foo+1/", b"foo/bar", "é".encode(), b"\xff", b"Zebra", b"apple", b"a", b"a\x00", b"foo"]
    for key in keys:
        put(store, key, [])
    assert [o.key for o in store.list_objects("photos").objects] == sorted(keys)
    assert [o.key for o in store.list_objects("photos").objects][:6] == [b"Zebra", b"a", b"a\x00", b"apple", b"foo",
                                                                          b"foo+1/"]
    page = store.list_objects("photos", prefix=b"foo", delimiter=b"/")
    assert [o.key for o in page.objects] == [b"foo"] and page.prefixes == [b"foo+1/", b"foo/"]


def test_listing_pages_with_prefix_delimiter_and_markers(store: NamespaceStore) -> None:
    keys = [b"a/1", b"a/2", b"b", b"c/x/1", b"c/y", b"d"]
    for key in keys:
        put(store, key, [])
    page = store.list_objects("photos", delimiter=b"/", max_keys=2)
    assert (page.prefixes, [o.key for o in page.objects], page.truncated, page.next_marker) == (
        [b"a/"], [b"b"], True, b"b")
    page = store.list_objects("photos", delimiter=b"/", after=page.next_marker, max_keys=2)
    assert (page.prefixes, [o.key for o in page.objects], page.truncated) == ([b"c/"], [b"d"], False)
    page = store.list_objects("photos", prefix=b"c/", delimiter=b"/", after=b"c/x/0")  # marker inside c/x/
    assert (page.prefixes, [o.key for o in page.objects]) == ([], [b"c/y"])
    assert store.list_objects("photos", max_keys=0) == store.list_objects("photos", prefix=b"zz")
    assert store.list_objects("photos", max_keys=0).truncated is False
    whole = store.list_objects("photos", prefix=b"a/", delimiter=b"x")
    assert [o.key for o in whole.objects] == [b"a/1", b"a/2"] and not whole.truncated


def test_a_page_of_1000_out_of_100000_keys_takes_under_50_ms(opener: Opener) -> None:
    store = opener()
    store.create_bucket("big", "alice")
    keys = [b"deep/%04d/img%05d.jpg" % (d, f) for d in range(50) for f in range(1000)]
    keys += [b"wide/%04d/img%05d.jpg" % (d, f) for d in range(1000) for f in range(50)]
    with store.transaction(write=True) as tx:  # one bulk insert: the commit path is tested above, this is listing
        bucket_id = store.bucket_id(tx, "big")
        tx.many("INSERT INTO objects (bucket_id, key, size, etag, mtime_ms, meta, checksums, parts_count, manifest) "
                "VALUES (?, ?, 1, ?, 0, ?, '{}', NULL, ?)",
                [(bucket_id, key, "e" * 32, encode_meta(ObjectMeta()), encode_manifest([Extent(0, 1, f"loc-{i}")]))
                 for i, key in enumerate(keys)])
        tx.run("ANALYZE objects")  # the statistics a live table has (PostgreSQL's autovacuum keeps them)
    cases = {"no delimiter": (b"", b"", b"deep/0042/img00500.jpg", 1000, 0),
             "delimiter, 1000 keys": (b"deep/0042/", b"/", None, 1000, 0),
             "delimiter, 50 prefixes": (b"deep/", b"/", None, 0, 50),
             "delimiter, 1000 prefixes": (b"wide/", b"/", None, 0, 1000)}
    for name, (prefix, delimiter, after, n_keys, n_prefixes) in cases.items():
        times = []
        for _ in range(7):
            start = time.perf_counter()
            page = store.list_objects("big", prefix=prefix, delimiter=delimiter, after=after, max_keys=1000)
            times.append(time.perf_counter() - start)
            assert (len(page.objects), len(page.prefixes)) == (n_keys, n_prefixes)
        print(f"list 1000 of 100,000 ({name}): median {statistics.median(times) * 1000:.1f} ms, "
              f"best {min(times) * 1000:.1f} ms")
        assert statistics.median(times) < 0.050, name


# multipart -----------------------------------------------------------------------------------------------------


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def upload_parts(store: NamespaceStore, key: bytes, sizes: list[int]) -> tuple[str, list[tuple[int, str]]]:
    upload = store.create_upload("photos", key, "alice", ObjectMeta(content_type="video/mp4", metadata={"a": "b"}))
    listed = []
    for number, size in enumerate(sizes, 1):
        intent = store.begin_intent(store.get_bucket("photos"), key)
        manifest = (Extent(0, size - 1, f"p{number}-a"), Extent(size - 1, 1, f"p{number}-b"))
        for extent in manifest:
            store.add_intent_extent(intent, extent)
        part = store.put_part("photos", upload.id, number, size, md5_hex(b"%d" % number), manifest, intent)
        listed.append((number, f'"{part.etag}"'))
    return upload.id, listed


def test_complete_joins_the_parts_manifests_and_sends_the_rest_to_gc(store: NamespaceStore) -> None:
    put(store, b"movie", ["old-object"])
    upload_id, listed = upload_parts(store, b"movie", [5 * MiB, 5 * MiB, 6 * MiB, 3])
    replaced = store.put_part("photos", upload_id, 2, 5 * MiB, md5_hex(b"two"), (Extent(0, 5 * MiB, "p2-new"),), None)
    listed[1] = (2, replaced.etag)
    record = store.complete_upload("photos", upload_id, [listed[0], listed[1], listed[3]])
    assert garbage(store) == {"old-object", "p2-a", "p2-b", "p3-a", "p3-b"}
    expected_etag = md5_hex(b"".join(bytes.fromhex(md5_hex(x)) for x in [b"1", b"two", b"4"])) + "-3"
    assert store.get_object("photos", b"movie") == record
    assert (record.size, record.etag, record.parts_count, record.meta.content_type) == (
        10 * MiB + 3, expected_etag, 3, "video/mp4")
    # each extent knows its part's place in the object (GET ?partNumber=), kept by the store
    assert record.manifest == (Extent(0, 5 * MiB - 1, "p1-a", 1), Extent(5 * MiB - 1, 1, "p1-b", 1),
                               Extent(5 * MiB, 5 * MiB, "p2-new", 2), Extent(10 * MiB, 2, "p4-a", 3),
                               Extent(10 * MiB + 2, 1, "p4-b", 3))
    with s3_error("NoSuchUpload"):
        store.list_parts("photos", upload_id)
    assert store.list_uploads("photos").uploads == []


@pytest.mark.parametrize(("parts", "code"), [
    ([], "MalformedXML"),
    ([(2, "e2"), (1, "e1")], "InvalidPartOrder"),
    ([(1, "e1"), (1, "e1")], "InvalidPartOrder"),
    ([(1, "e1"), (5, "e4")], "InvalidPart"),
    ([(1, "e1"), (2, "e1")], "InvalidPart"),
    ([(3, "e3"), (4, "e4")], "EntityTooSmall"),
])
def test_complete_checks_the_parts_and_changes_nothing_when_they_fail(store: NamespaceStore,
                                                                      parts: list[tuple[int, str]], code: str) -> None:
    upload_id, listed = upload_parts(store, b"movie", [5 * MiB, 5 * MiB, 1, 1])
    etags = {f"e{n}": etag for n, etag in listed}
    before = dump(store)
    with s3_error(code):
        store.complete_upload("photos", upload_id, [(n, etags[e]) for n, e in parts])
    assert dump(store) == before
    with s3_error("NoSuchUpload"):
        store.complete_upload("photos", "no-such-upload", listed)


def test_a_conditional_complete_that_fails_keeps_the_upload(store: NamespaceStore) -> None:
    put(store, b"movie", ["old"])
    upload_id, listed = upload_parts(store, b"movie", [5 * MiB, 1])
    before = dump(store)
    with s3_error("PreconditionFailed"):
        store.complete_upload("photos", upload_id, listed, IfNoneMatch())
    assert dump(store) == before
    assert store.complete_upload("photos", upload_id, listed, IfMatch(store.get_object("photos", b"movie").etag))


def test_abort_sends_every_part_to_gc(store: NamespaceStore) -> None:
    upload_id, _ = upload_parts(store, b"movie", [5 * MiB, 7])
    store.abort_upload("photos", upload_id)
    assert garbage(store) == {"p1-a", "p1-b", "p2-a", "p2-b"}
    with s3_error("NoSuchUpload"):
        store.abort_upload("photos", upload_id)
    with s3_error("NoSuchUpload"):
        store.put_part("photos", upload_id, 1, 1, "aa" * 16, (), None)


def test_part_numbers_are_1_to_10000_and_parts_list_in_pages(store: NamespaceStore) -> None:
    upload_id, _ = upload_parts(store, b"movie", [1, 2, 3, 4, 5])
    for number in (0, 10_001):
        with s3_error("InvalidArgument"):
            store.put_part("photos", upload_id, number, 1, "aa" * 16, (), None)
    page = store.list_parts("photos", upload_id, max_parts=2)
    assert [p.number for p in page.parts] == [1, 2] and page.truncated and page.next_part_number_marker == 2
    assert store.get_upload("photos", upload_id).key == b"movie"
    page = store.list_parts("photos", upload_id, part_number_marker=2, max_parts=3)
    assert [(p.number, p.size) for p in page.parts] == [(3, 3), (4, 4), (5, 5)] and not page.truncated
    assert page.upload.key == b"movie" and page.upload.meta.metadata == {"a": "b"}


def test_uploads_list_by_key_then_initiation_with_markers_and_prefixes(store: NamespaceStore, clock: Clock) -> None:
    ids: dict[str, list[str]] = {}
    for key in ["b", "a/x", "b", "a/y", "c", "b"]:
        clock.now += 1
        ids.setdefault(key, []).append(store.create_upload("photos", key.encode(), "alice").id)
    page = store.list_uploads("photos")
    assert [(u.key, u.id) for u in page.uploads] == [(k.encode(), i) for k in sorted(ids) for i in ids[k]]
    page = store.list_uploads("photos", delimiter=b"/", max_uploads=3)
    assert page.prefixes == [b"a/"] and [u.id for u in page.uploads] == ids["b"][:2] and page.truncated
    assert (page.next_key_marker, page.next_upload_id_marker) == (b"b", ids["b"][1])
    page = store.list_uploads("photos", delimiter=b"/", key_marker=page.next_key_marker,
                              upload_id_marker=page.next_upload_id_marker)
    assert [(u.key, u.id) for u in page.uploads] == [(b"b", ids["b"][2]), (b"c", ids["c"][0])] and not page.truncated
    page = store.list_uploads("photos", key_marker=b"b")  # without an upload id marker: past every upload of "b"
    assert [u.key for u in page.uploads] == [b"c"]
    page = store.list_uploads("photos", prefix=b"a/", max_uploads=1)
    assert [u.key for u in page.uploads] == [b"a/x"] and page.truncated


# garbage and crashes -------------------------------------------------------------------------------------------


def test_a_crashed_puts_blobs_are_swept_and_its_late_commit_refused(store: NamespaceStore, clock: Clock) -> None:
    intent = store.begin_intent(store.get_bucket("photos"), b"k")
    store.add_intent_extent(intent, Extent(0, 10, "loc-1"))
    clock.now += 1000
    recent = store.begin_intent(store.get_bucket("photos"), b"k2")
    assert store.stale_intents(older_than_ms=clock.now - 500) == 1
    assert garbage(store) == {"loc-1"}
    with s3_error("InternalError"):
        store.add_intent_extent(intent, Extent(10, 10, "loc-2"))
    assert garbage(store) == {"loc-1", "loc-2"}
    with s3_error("InternalError"):
        store.commit_object("photos", ObjectRecord(b"k", 20, "aa" * 16, 0, manifest=(Extent(0, 10, "loc-1"),)),
                            intent)
    with s3_error("NoSuchKey"):
        store.get_object("photos", b"k")
    store.commit_object("photos", ObjectRecord(b"k2", 0, "aa" * 16, 0), recent)
    assert store.stale_intents(older_than_ms=clock.now + 1) == 0


# concurrency and the SQLite file -------------------------------------------------------------------------------


def test_threads_writing_through_one_store_and_another_lose_nothing(opener: Opener) -> None:
    stores = [opener(), opener()]
    stores[0].create_bucket("busy", "alice")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(25):
                put(stores[n % 2], b"t%d/%02d" % (n, i), [f"loc-{n}-{i}"], bucket="busy")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(stores[1].list_objects("busy").objects) == 100
    assert stores[0].list_objects("busy", delimiter=b"/").prefixes == [b"t0/", b"t1/", b"t2/", b"t3/"]


def race(count: int, work: Callable[[int], object]) -> list[object]:
    """`work(0)` .. `work(count - 1)` at once in threads; what each returned or raised."""
    results: list[object] = [None] * count

    def run(n: int) -> None:
        try:
            results[n] = work(n)
        except Exception as exc:
            results[n] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_two_racing_if_none_match_puts_of_a_key_one_wins_the_other_is_refused(opener: Opener) -> None:
    stores = [opener(), opener()]
    stores[0].create_bucket("race", "alice")
    for round_ in range(10):
        key = b"k%d" % round_
        ready = threading.Barrier(2)

        def conditional_put(n: int, key: bytes = key, ready: threading.Barrier = ready) -> object:
            store = stores[n]
            intent = store.begin_intent(store.get_bucket("race"), key)
            store.add_intent_extent(intent, Extent(0, 10, f"loc-{key.decode()}-{n}"))
            ready.wait()  # both hold their blobs; now both commit
            try:
                store.commit_object("race", ObjectRecord(key, 10, "ab" * 16, 0, manifest=(
                    Extent(0, 10, f"loc-{key.decode()}-{n}"),)), intent, IfNoneMatch())
            except S3Error:
                store.abandon_intent(intent)  # as the gateway does after any failure
                raise
            return n

        results = race(2, conditional_put)
        winners = [r for r in results if isinstance(r, int)]
        refused = [r for r in results if isinstance(r, S3Error)]
        assert len(winners) == 1 and len(refused) == 1, results
        assert refused[0].code in ("PreconditionFailed", "ConditionalRequestConflict")
        loser = 1 - winners[0]
        assert stores[loser].get_object("race", key).manifest[0].location == f"loc-{key.decode()}-{winners[0]}"
        assert f"loc-{key.decode()}-{loser}" in garbage(stores[0])


def test_racing_overwrites_of_keys_lose_no_blob_and_leak_none(opener: Opener) -> None:
    """Every PUT but the last of each key has its blobs in the GC outbox, whoever wrote first (or inserted first)."""
    stores = [opener(), opener()]
    stores[0].create_bucket("race", "alice")

    def overwrite(n: int) -> None:
        for i in range(8):
            for key in (b"a", b"b", b"new%d" % i):
                put(stores[n], key, [f"{key.decode()}-{n}-{i}"], bucket="race")

    assert race(2, overwrite) == [None, None]
    live = {o.key: stores[1].get_object("race", o.key).manifest[0].location
            for o in stores[1].list_objects("race").objects}
    written = {f"{key}-{n}-{i}" for n in range(2) for i in range(8) for key in ("a", "b", f"new{i}")}
    assert len(live) == 10 and garbage(stores[0]) == written - set(live.values())


def test_sqlite_commits_are_durable_and_a_writer_kept_waiting_answers_slow_down(tmp_path: Path, clock: Clock) -> None:
    path = tmp_path / "namespace.db"
    store = NamespaceStore(sqlite_connect(path, busy_timeout_ms=100), SQLITE, clock=clock)
    with store.transaction(write=False) as tx:
        assert tx.all("PRAGMA journal_mode") == [("wal",)] and tx.all("PRAGMA synchronous") == [(2,)]  # FULL
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with s3_error("SlowDown"):
        store.create_bucket("photos", "alice")
    assert store.list_buckets("alice") == []  # readers do not wait for the writer
    other.execute("ROLLBACK")
    other.close()
    store.create_bucket("photos", "alice")
    assert [b.name for b in store.list_buckets("alice")] == ["photos"]
    store.close()


def test_postgresql_commits_are_durable_and_a_writer_kept_waiting_answers_slow_down(postgres_dsn: str,
                                                                                    clock: Clock) -> None:
    store = NamespaceStore(postgres_connect(postgres_dsn, lock_timeout_ms=100), POSTGRESQL, clock=clock)
    with store.transaction(write=False) as tx:
        assert tx.all("SHOW synchronous_commit") == [("on",)] and tx.all("SHOW fsync") == [("on",)]
    store.create_bucket("photos", "alice")
    put(store, b"k", ["loc-1"])
    with psycopg.connect(postgres_dsn, autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT 1 FROM objects WHERE key = %s FOR UPDATE", (b"k",))
        with s3_error("SlowDown"):
            store.delete_object("photos", b"k")
        assert store.get_object("photos", b"k").manifest[0].location == "loc-1"  # readers do not wait
        other.execute("ROLLBACK")
    assert store.delete_object("photos", b"k") is True
    store.close()


def test_a_lost_postgresql_connection_answers_service_unavailable_once_then_a_new_one_serves(
        postgres_dsn: str) -> None:
    store = open_namespace(postgres_dsn)
    store.create_bucket("photos", "alice")
    with store.transaction(write=False) as tx:
        (backend,) = tx.one("SELECT pg_backend_pid()") or ()
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with s3_error("ServiceUnavailable"):
        store.get_bucket("photos")
    assert store.get_bucket("photos").name == "photos"
    store.close()
