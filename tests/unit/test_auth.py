"""Request signing: what a signature covers, its window, capabilities, identities, replays and rotation."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlencode

import pytest

from blobstore_server.libs.proto import blobnode, clustermgr
from blobstore_server.libs.proto.routes import CATALOG
from blobstore_server.libs.rpc.auth import (
    AUTH_HEADER,
    MAX_GRANT,
    AuthConfig,
    Caller,
    Grant,
    NonceCache,
    Signer,
    Verifier,
    body_digest,
    encode_query,
    install,
    installed,
    new_secret,
    required_capability,
    sign,
)
from blobstore_server.libs.rpc.client import presigned
from blobstore_server.libs.rpc.errors import Forbidden, Unauthorized, Unavailable
from blobstore_server.libs.rpc.routes import Capability, Route, RouteTable

SECRET = new_secret()
NOW = 1_000_000.0
C = Capability


def verifier(capabilities: tuple[Capability, ...] = (C.UNITS, C.OBSERVE), previous: str | None = None,
             identities: bool = False, clock: float = NOW) -> Verifier:
    return Verifier(AuthConfig.for_capabilities(SECRET, capabilities, previous, verifies_identities=identities),
                    CATALOG, clock=lambda: clock)


def signer(*capabilities: Capability, secret: str = SECRET, clock: float = NOW, name: str | None = None) -> Signer:
    return Signer.from_config(AuthConfig.for_capabilities(secret, capabilities, name=name)) if name else Signer(
        AuthConfig.for_capabilities(secret, capabilities).keys, clock=lambda: clock)


def signed(by: Signer, method: str, url: str, params: dict[str, str] | None = None,
           body: bytes | None = b"{}") -> str:
    return by.header(method, url, params, body, CATALOG)


def test_a_signed_request_passes_and_any_change_to_it_does_not() -> None:
    header = signed(signer(C.UNITS), "POST", "http://h/volume/lock?x=1", {"vid": "7"})
    check = verifier().check
    for method, path, query, body in [("GET", "/volume/lock", "vid=7&x=1", b"{}"),
                                      ("POST", "/volume/unlock", "vid=7&x=1", b"{}"),
                                      ("POST", "/volume/lock", "vid=8&x=1", b"{}"),
                                      ("POST", "/volume/lock", "vid=7&x=1", b'{"vid":1}'),
                                      ("POST", "/volume/lock", "vid=7&x=1", b"{}"),  # the query as sent is signed
                                      ("POST", "/volume/lock", "x=1&vid=%37", b"{}")]:
        with pytest.raises(Unauthorized, match="bad signature"):
            check(method, path, query, header, body, len(body), "h")
    assert check("POST", "/volume/lock", "x=1&vid=7", header, b"{}", 2, "h") == Caller(C.UNITS)


def test_a_request_signed_for_one_service_fails_at_another() -> None:
    header = signed(signer(C.UNITS), "POST", "http://a:1/volume/lock")
    with pytest.raises(Unauthorized, match="bad signature"):
        verifier().check("POST", "/volume/lock", "", header, b"{}", 2, "b:1")
    assert verifier().check("POST", "/volume/lock", "", header, b"{}", 2, "A:1")  # Host is case-insensitive


def test_a_request_is_taken_once_and_only_within_its_window() -> None:
    check = verifier().check
    header = signed(signer(C.UNITS), "POST", "http://h/volume/lock")
    assert check("POST", "/volume/lock", "", header, b"{}", 2, "h")
    with pytest.raises(Unauthorized, match="used before"):
        check("POST", "/volume/lock", "", header, b"{}", 2, "h")
    with pytest.raises(Unauthorized, match="outside the 60s window"):
        check("POST", "/volume/lock", "", signed(signer(C.UNITS, clock=NOW - 61), "POST", "http://h/volume/lock"),
              b"{}", 2, "h")
    with pytest.raises(Unauthorized, match="ahead of this clock"):
        check("POST", "/volume/lock", "", signed(signer(C.UNITS, clock=NOW + 6), "POST", "http://h/volume/lock"),
              b"{}", 2, "h")
    assert check("POST", "/volume/lock", "", signed(signer(C.UNITS, clock=NOW + 5), "POST", "http://h/volume/lock"),
                 b"{}", 2, "h")


def test_the_nonce_cache_forgets_only_what_cannot_pass_anyway_and_refuses_when_full() -> None:
    cache = NonceCache(limit=2)
    cache.add("a", until=10, now=0)
    cache.add("b", until=20, now=0)
    with pytest.raises(Unavailable):
        cache.add("c", until=30, now=5)
    cache.add("c", until=30, now=11)  # "a" expired and is dropped
    with pytest.raises(Unauthorized):  # a replay carries its original's signed time, hence its `until`
        cache.add("b", until=20, now=12)
    cache.add("a", until=30.5, now=21)  # "b" expired: room again, and "a" was forgotten


def test_missing_malformed_and_foreign_signatures_are_401() -> None:
    check = verifier().check
    for header in (None, "", "v1 role=control ts=1 sig=00", "v2 cap=root ts=1 n=1 sig=00", "v2 cap=units ts=1"):
        with pytest.raises(Unauthorized):
            check("POST", "/volume/lock", "", header, b"{}", 2, "h")
    with pytest.raises(Unauthorized, match="bad signature"):
        check("POST", "/volume/lock", "", signed(signer(C.UNITS, secret=new_secret()), "POST",
                                                 "http://h/volume/lock"), b"{}", 2, "h")


def test_each_route_takes_exactly_its_capability() -> None:
    operator = Signer(AuthConfig.for_capabilities(SECRET, Capability).keys, clock=lambda: NOW)
    with pytest.raises(Forbidden, match="lacks"):  # refused before anything is sent
        signed(signer(C.UNITS), "POST", "http://h/config/set")
    clustermgr = verifier((C.ADMIN, C.KV, C.UNITS))
    key = AuthConfig.for_capabilities(SECRET, [C.KV]).keys[C.KV]
    as_kv = f"v2 cap=kv ts={int(NOW)} n=1 sig=" + sign(bytes.fromhex(key), "POST", "h", "/config/set", "",
                                                       body_digest(b"{}"), str(int(NOW)), C.KV, "1", "")
    with pytest.raises(Forbidden, match="takes the admin capability, not kv"):
        clustermgr.check("POST", "/config/set", "", as_kv, b"{}", 2, "h")
    assert clustermgr.check("POST", "/config/set", "", signed(operator, "POST", "http://h/config/set"), b"{}", 2, "h")
    blobnode = verifier((C.READ_SHARD, C.WRITE_SHARD))
    with pytest.raises(Unauthorized, match="takes no admin"):  # a blobnode never holds the admin key
        blobnode.check("POST", "/config/set", "", signed(operator, "POST", "http://h/config/set"), b"{}", 2, "h")
    assert required_capability(CATALOG, "/health") is None and required_capability(CATALOG, "/metrics") is None
    assert required_capability(CATALOG, "/some/new/route") is C.ADMIN  # closed until declared
    assert required_capability(CATALOG, "/shard/delete") is C.DELETE_SHARD
    assert required_capability(CATALOG, "/kv/set") is C.KV
    assert C.RAFT_MEMBER not in CATALOG.capabilities.values()
    assert C.ADMIN not in (CATALOG.capabilities["/task/migrate"], CATALOG.capabilities["/disk/set"])


def test_auth_requires_what_each_route_declares() -> None:
    assert all(required_capability(CATALOG, route.path) is route.capability for route in CATALOG)


def test_a_service_checks_its_own_routes_and_a_path_is_declared_with_one_capability() -> None:
    """Each service hands its own table to its server and its client: another service's path is not declared
    there, so it takes `admin`; the tables agree on a path several services serve (`/stat`)."""
    assert required_capability(blobnode.ROUTES, "/shard/delete") is C.DELETE_SHARD
    assert required_capability(blobnode.ROUTES, "/kv/set") is C.ADMIN
    assert required_capability(clustermgr.ROUTES, "/kv/set") is C.KV
    assert blobnode.ROUTES.streamed == CATALOG.streamed == {"/shard/put", "/shard/put_batch"}
    assert clustermgr.ROUTES.streamed == frozenset()
    with pytest.raises(ValueError, match="/stat is declared with both observe and admin"):
        RouteTable(*blobnode.ROUTES, Route("GET", "/stat", C.ADMIN))


def test_shard_bodies_are_signed_by_length_and_crc() -> None:
    check = verifier((C.WRITE_SHARD,)).check
    header = signed(signer(C.WRITE_SHARD), "POST", "http://h/shard/put?bid=3&crc=77", body=b"x" * 1000)
    assert check("POST", "/shard/put", "bid=3&crc=77", header, None, 1000, "h")
    header = signed(signer(C.WRITE_SHARD), "POST", "http://h/shard/put?bid=3&crc=77", body=b"x" * 1000)
    for query, length in (("bid=3&crc=77", 1001), ("bid=3&crc=78", 1000)):
        with pytest.raises(Unauthorized, match="bad signature"):
            check("POST", "/shard/put", query, header, None, length, "h")
    no_crc = signed(signer(C.WRITE_SHARD), "POST", "http://h/shard/put?bid=3", body=b"x" * 1000)
    with pytest.raises(Unauthorized, match="must sign the shard's CRC"):
        check("POST", "/shard/put", "bid=3", no_crc, None, 1000, "h")
    only_alike = signed(signer(C.WRITE_SHARD), "POST", "http://h/shard/put?bid=3&xcrc=77", body=b"x" * 1000)
    with pytest.raises(Unauthorized, match="must sign the shard's CRC"):
        check("POST", "/shard/put", "bid=3&xcrc=77", only_alike, None, 1000, "h")
    crc_first = signed(signer(C.WRITE_SHARD), "POST", "http://h/shard/put?crc=77&bid=3", body=b"x" * 1000)
    assert check("POST", "/shard/put", "crc=77&bid=3", crc_first, None, 1000, "h")


def test_queries_are_encoded_as_urlencode_does() -> None:
    for params in ({"disk_id": "1", "vuid": "4294967297", "bid": "12.13.14", "crc": "77"},
                   {"name": "a b/c", "é": "x&y=z", "t": "~_.-", "empty": ""}, {}):
        assert encode_query(params) == urlencode(params)


def test_disk_reports_carry_their_signers_identity_which_no_other_process_can_claim() -> None:
    clustermgr = verifier((C.OBSERVE,), identities=True, clock=0)
    node_a = signer(C.OBSERVE, name="http://a:1")
    header = signed(node_a, "POST", "http://h/disk/broken")
    fields = dict(part.partition("=")[::2] for part in header.split()[1:])
    clustermgr.clock = lambda: float(fields["ts"])
    assert clustermgr.check("POST", "/disk/broken", "", header, b"{}", 2, "h") == Caller(C.DISK_REPORT, "http://a:1")
    claimed = signed(node_a, "POST", "http://h/disk/broken").replace("id=http://a:1", "id=http://b:1")
    with pytest.raises(Unauthorized, match="bad signature"):
        clustermgr.check("POST", "/disk/broken", "", claimed, b"{}", 2, "h")
    with pytest.raises(Forbidden, match="has none"):  # a process without an identity cannot sign a report
        signed(signer(C.OBSERVE), "POST", "http://h/disk/broken")
    plain = verifier((C.OBSERVE,))
    plain.clock = clustermgr.clock
    with pytest.raises(Unauthorized, match="takes no disk-report"):
        plain.check("POST", "/disk/broken", "", signed(node_a, "POST", "http://h/disk/broken"), b"{}", 2, "h")


def test_rotation_accepts_old_and_new_keys_during_the_overlap() -> None:
    new = new_secret()
    rotating = Verifier(AuthConfig.for_capabilities(new, [C.OBSERVE], previous_secret=SECRET), CATALOG,
                        clock=lambda: NOW)
    for secret in (SECRET, new):
        assert rotating.check("GET", "/volume/list", "", signed(signer(C.OBSERVE, secret=secret), "GET",
                                                                "http://h/volume/list", body=None), b"", 0, "h")
    after = Verifier(AuthConfig.for_capabilities(new, [C.OBSERVE]), CATALOG, clock=lambda: NOW)
    with pytest.raises(Unauthorized):
        after.check("GET", "/volume/list", "", signed(signer(C.OBSERVE), "GET", "http://h/volume/list", body=None),
                    b"", 0, "h")


def test_a_read_grant_reads_until_it_expires_and_can_do_nothing_else() -> None:
    blobnode = verifier((C.READ_SHARD, C.WRITE_SHARD, C.DELETE_SHARD, C.CHUNK, C.OBSERVE))
    operator = Signer(AuthConfig.for_capabilities(SECRET, Capability).keys, clock=lambda: NOW)
    grant = operator.grant(C.READ_SHARD, 3600)
    assert grant.expires == NOW + 3600 and grant.key not in repr(grant)  # never printed by accident
    executor = Signer.from_grant(grant, clock=lambda: NOW)
    for path in ("/shard/get", "/shard/list", "/shard/stat", "/chunk/list", "/chunk/stat"):
        header = signed(executor, "GET", f"http://h{path}?vid=1", body=None)
        assert blobnode.check("GET", path, "vid=1", header, b"", 0, "h") == Caller(C.READ_SHARD)
    for path in ("/shard/put", "/shard/delete", "/shard/markdelete", "/chunk/create", "/chunk/release", "/stat"):
        with pytest.raises(Forbidden, match="lacks"):
            signed(executor, "POST", f"http://h{path}")
    later = verifier((C.READ_SHARD,), clock=NOW + 3601)
    with pytest.raises(Unauthorized, match="grant expired 1s ago"):
        later.check("GET", "/shard/get", "", signed(Signer.from_grant(grant, clock=lambda: NOW + 3601), "GET",
                                                    "http://h/shard/get", body=None), b"", 0, "h")


def test_a_grant_cannot_be_stretched_forged_or_pushed_past_the_limit() -> None:
    blobnode = verifier((C.READ_SHARD,))
    operator = Signer(AuthConfig.for_capabilities(SECRET, Capability).keys, clock=lambda: NOW)
    grant = operator.grant(C.READ_SHARD, 60)
    stretched = Signer.from_grant(Grant(C.READ_SHARD, grant.expires + 86400, grant.key), clock=lambda: NOW)
    stranger = Signer.from_grant(Signer(AuthConfig.for_capabilities(new_secret(), Capability).keys,
                                        clock=lambda: NOW).grant(C.READ_SHARD, 60), clock=lambda: NOW)
    for by in (stretched, stranger):
        with pytest.raises(Unauthorized, match="bad signature"):
            blobnode.check("GET", "/shard/get", "", signed(by, "GET", "http://h/shard/get", body=None), b"", 0, "h")
    too_long = Signer.from_grant(operator.grant(C.READ_SHARD, MAX_GRANT + 60), clock=lambda: NOW)
    with pytest.raises(Unauthorized, match="may reach"):
        blobnode.check("GET", "/shard/get", "", signed(too_long, "GET", "http://h/shard/get", body=None), b"", 0, "h")
    with pytest.raises(KeyError):  # a signer can only hand on a capability it holds
        Signer(AuthConfig.for_capabilities(SECRET, [C.WRITE_SHARD]).keys).grant(C.READ_SHARD, 60)


def test_an_sdk_grant_token_signs_the_undelete_and_nothing_else() -> None:
    """The SDK signs with a grant token (blobstore.signing) in the servers' own scheme: access takes it for its one
    signed route, with the undelete capability only; its other routes stay public (the Location is the capability)."""
    access = verifier((C.UNDELETE,))
    operator = Signer(AuthConfig.for_capabilities(SECRET, Capability).keys, clock=lambda: NOW)
    token = operator.grant(C.UNDELETE, 3600).to_token()
    body = b'{"location":"abc"}'
    header = Grant.from_token(token).header("POST", "http://h:1/undelete", body, now=NOW)
    assert access.check("POST", "/undelete", "", header, body, len(body), "h:1") == Caller(C.UNDELETE)
    with pytest.raises(Unauthorized, match="bad signature"):  # the location changed on the way
        access.check("POST", "/undelete", "", Grant.from_token(token).header("POST", "http://h:1/undelete", body,
                                                                             now=NOW), b'{"location":"abd"}', 18, "h:1")
    reader = Grant.from_token(operator.grant(C.READ_SHARD, 3600).to_token())
    with pytest.raises(Forbidden, match="takes the undelete capability"):
        verifier((C.UNDELETE, C.READ_SHARD)).check("POST", "/undelete", "", reader.header(
            "POST", "http://h:1/undelete", body, now=NOW), body, len(body), "h:1")
    assert required_capability(CATALOG, "/undelete", public=True) is C.UNDELETE
    assert required_capability(CATALOG, "/blob/abc", public=True) is None
    assert required_capability(CATALOG, "/blob/abc") is C.ADMIN
    with pytest.raises(ValueError, match="not a grant"):
        Grant.from_token(token[:-1])


def test_signing_and_checking_keep_the_gil_while_another_thread_is_busy() -> None:
    """A process whose other threads are busy (codec, disk) pays the interpreter's 5 ms switch interval for each
    call that gives up the GIL: hmac.digest and os.urandom did, once per signature and once per check."""
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=busy)
    spinner.start()
    try:
        by, check = signer(C.UNITS, clock=time.time()), verifier(clock=time.time())
        started = time.perf_counter()
        for _ in range(200):
            check.check("POST", "/volume/lock", "vid=7", signed(by, "POST", "http://a:1/volume/lock", {"vid": "7"}),
                        b"{}", 2, "a:1")
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        spinner.join()
    assert elapsed < 0.3, f"200 signed and checked requests took {elapsed:.2f} s beside a busy thread"


def test_a_presigned_shard_read_passes_once_as_given_and_an_unsigning_process_gives_no_header() -> None:
    before = installed()  # a test that launched a cluster left this process signing as the operator
    try:
        install(None)
        url, headers = presigned("GET", "http://h:1/shard/get", {"disk_id": 1, "vuid": 2, "bid": 3, "size": 4},
                                 blobnode.ROUTES)
        assert (url, headers) == ("http://h:1/shard/get?disk_id=1&vuid=2&bid=3&size=4", {})
        install(signer(C.READ_SHARD))
        url, headers = presigned("GET", "http://h:1/shard/get", {"disk_id": 1, "vuid": 2, "bid": 3, "size": 4},
                                 blobnode.ROUTES)
    finally:
        install(before)
    check = verifier((C.READ_SHARD,)).check
    query = url.partition("?")[2]
    with pytest.raises(Unauthorized, match="bad signature"):
        check("GET", "/shard/get", query.replace("size=4", "size=5"), headers[AUTH_HEADER], b"", 0, "h:1")
    assert check("GET", "/shard/get", query, headers[AUTH_HEADER], b"", 0, "h:1") == Caller(C.READ_SHARD)
    with pytest.raises(Unauthorized, match="used before"):
        check("GET", "/shard/get", query, headers[AUTH_HEADER], b"", 0, "h:1")


def test_a_blobnodes_key_cannot_lease_and_an_allocators_cannot_report_disks() -> None:
    clustermgr = verifier((C.OBSERVE,), identities=True, clock=0)
    node = signer(C.OBSERVE, C.DISK_REPORT, name="http://a:1")
    allocator = signer(C.OBSERVE, C.LEASE, name="http://alloc:1")
    with pytest.raises(Forbidden, match="own lease identity"):
        signed(node, "POST", "http://h/volume/release")
    with pytest.raises(Forbidden, match="own disk-report identity"):
        signed(allocator, "POST", "http://h/disk/broken")
    header = signed(allocator, "POST", "http://h/volume/release")
    clustermgr.clock = lambda: float(dict(p.partition("=")[::2] for p in header.split()[1:])["ts"])
    assert clustermgr.check("POST", "/volume/release", "", header, b"{}", 2, "h") == Caller(C.LEASE, "http://alloc:1")
    # the disk-report key relabelled as a lease signature is not the lease key
    forged = signed(node, "POST", "http://h/disk/broken").replace("cap=disk-report", "cap=lease")
    with pytest.raises(Unauthorized, match="bad signature"):
        clustermgr.check("POST", "/volume/release", "", forged, b"{}", 2, "h")
    assert C.LEASE not in AuthConfig.for_capabilities(SECRET, (C.OBSERVE, C.LEASE), name="x").keys  # not shared


def test_a_config_of_one_identity_key_is_its_disk_report_key() -> None:
    config = AuthConfig.for_capabilities(SECRET, (C.OBSERVE, C.DISK_REPORT), name="http://a:1")
    assert config.identity is not None
    legacy = AuthConfig.model_validate({"keys": config.keys, "identity": {
        "name": "http://a:1", "key": config.identity.keys[C.DISK_REPORT]}})
    assert legacy.identity == config.identity


def test_a_signature_dated_before_the_verifier_started_is_refused() -> None:
    """Its previous run's nonces are gone: what it could have taken then must not pass now (a restart)."""
    restarted = verifier(clock=NOW)
    for ts in (NOW - 1, NOW - 59):
        with pytest.raises(Unauthorized, match="before this service started"):
            restarted.check("POST", "/volume/lock", "", signed(signer(C.UNITS, clock=ts), "POST",
                                                               "http://h/volume/lock"), b"{}", 2, "h")
    later = NOW + 0.9  # signed within the second it started: taken
    restarted.clock = lambda: later
    assert restarted.check("POST", "/volume/lock", "", signed(signer(C.UNITS, clock=later), "POST",
                                                              "http://h/volume/lock"), b"{}", 2, "h")


def test_the_session_header_is_signed_so_it_cannot_be_stripped_added_or_altered() -> None:
    check = verifier().check
    header = signer(C.UNITS).header("POST", "http://h/volume/lock", None, b"{}", CATALOG, "c1 7 6 sched/leader 3")
    for session in ("", "c1 7 6 sched/leader 4", "c1 8 6 sched/leader 3"):
        with pytest.raises(Unauthorized, match="bad signature"):
            check("POST", "/volume/lock", "", header, b"{}", 2, "h", session)
    plain = signed(signer(C.UNITS), "POST", "http://h/volume/lock")
    with pytest.raises(Unauthorized, match="bad signature"):  # one added to a request signed without
        check("POST", "/volume/lock", "", plain, b"{}", 2, "h", "c1 7 6")
    assert check("POST", "/volume/lock", "", header, b"{}", 2, "h", "c1 7 6 sched/leader 3")
    assert check("POST", "/volume/lock", "", plain, b"{}", 2, "h")


def test_one_caller_filling_its_share_of_the_nonce_cache_leaves_the_others_served() -> None:
    cache = NonceCache(limit=10, per_caller=3)
    for n in range(3):
        cache.add(f"a{n}", until=10, now=0, caller="allocate")
    with pytest.raises(Unavailable, match="of allocate"):
        cache.add("a3", until=10, now=0, caller="allocate")
    with pytest.raises(Unauthorized):  # a replay is still a replay, full or not
        cache.add("a0", until=10, now=0, caller="allocate")
    cache.add("a0", until=10, now=0, caller="units")  # the same nonce under another caller is not a replay
    cache.add("b1", until=10, now=0, caller="units")
    cache.add("a3", until=20, now=11, caller="allocate")  # its first three expired: its share is free again


def test_a_verifier_answers_503_only_to_the_caller_that_floods_it() -> None:
    config = AuthConfig.for_capabilities(SECRET, (C.UNITS, C.OBSERVE)).model_copy(update={"caller_nonces": 5})
    flooded = Verifier(config, CATALOG, clock=lambda: NOW)
    units = signer(C.UNITS)
    for _ in range(5):
        flooded.check("POST", "/volume/lock", "", signed(units, "POST", "http://h/volume/lock"), b"{}", 2, "h")
    with pytest.raises(Unavailable):
        flooded.check("POST", "/volume/lock", "", signed(units, "POST", "http://h/volume/lock"), b"{}", 2, "h")
    assert flooded.check("GET", "/volume/list", "", signed(signer(C.OBSERVE), "GET", "http://h/volume/list",
                                                           body=None), b"", 0, "h")
