"""Request signing: what a signature covers, its window, roles, and rotation."""

from __future__ import annotations

import pytest

from libs.rpc.auth import MAX_GRANT, AuthConfig, Grant, Role, Signer, Verifier, new_secret, required_role
from libs.rpc.errors import Forbidden, Unauthorized

SECRET = new_secret()
NOW = 1_000_000.0


def verifier(roles: tuple[Role, ...] = (Role.DATA, Role.CONTROL), previous: str | None = None) -> Verifier:
    return Verifier(AuthConfig.for_roles(SECRET, roles, previous), clock=lambda: NOW)


def signed(signer: Signer, method: str, url: str, params: dict[str, str] | None = None,
           body: bytes | None = b"{}") -> str:
    return signer.header(method, url, params, body)


def test_a_signed_request_passes_and_any_change_to_it_does_not() -> None:
    signer = Signer(AuthConfig.for_roles(SECRET, [Role.CONTROL]).keys, clock=lambda: NOW)
    header = signed(signer, "POST", "http://h/volume/lock?x=1", {"vid": "7"})
    check = verifier().check
    assert check("POST", "/volume/lock", "vid=7&x=1", header, b"{}", 2) is Role.CONTROL
    assert check("POST", "/volume/lock", "x=1&vid=7", header, b"{}", 2) is Role.CONTROL  # any query order
    for method, path, query, body in [("GET", "/volume/lock", "vid=7&x=1", b"{}"),
                                      ("POST", "/volume/unlock", "vid=7&x=1", b"{}"),
                                      ("POST", "/volume/lock", "vid=8&x=1", b"{}"),
                                      ("POST", "/volume/lock", "vid=7&x=1", b'{"vid":1}')]:
        with pytest.raises(Unauthorized, match="bad signature"):
            check(method, path, query, header, body, len(body))


def test_missing_malformed_stale_and_unknown_role_signatures_are_401() -> None:
    check = verifier().check
    for header in (None, "", "v2 role=control ts=1 sig=00", "v1 role=root ts=1 sig=00", "v1 role=control"):
        with pytest.raises(Unauthorized):
            check("POST", "/volume/lock", "", header, b"{}", 2)
    old = Signer(AuthConfig.for_roles(SECRET, [Role.CONTROL]).keys, clock=lambda: NOW - 61)
    with pytest.raises(Unauthorized, match="outside the 60s window"):
        check("POST", "/volume/lock", "", signed(old, "POST", "http://h/volume/lock"), b"{}", 2)
    other = Signer(AuthConfig.for_roles(new_secret(), [Role.CONTROL]).keys, clock=lambda: NOW)
    with pytest.raises(Unauthorized, match="bad signature"):
        check("POST", "/volume/lock", "", signed(other, "POST", "http://h/volume/lock"), b"{}", 2)


def test_roles_below_the_route_are_403_and_signers_pick_the_least_role_that_fits() -> None:
    operator = Signer(AuthConfig.for_roles(SECRET, Role).keys, clock=lambda: NOW)
    service = Signer(AuthConfig.for_roles(SECRET, [Role.DATA, Role.CONTROL]).keys, clock=lambda: NOW)
    assert operator.role_for("/config/set") is Role.ADMIN and operator.role_for("/shard/get") is Role.READ
    assert operator.role_for("/shard/put") is Role.DATA and service.role_for("/shard/get") is Role.DATA
    assert operator.role_for("/volume/list") is Role.CONTROL and service.role_for("/config/set") is Role.CONTROL
    clustermgr = verifier(tuple(Role))
    header = signed(service, "POST", "http://h/config/set")
    with pytest.raises(Forbidden, match="takes a admin caller, not control"):
        clustermgr.check("POST", "/config/set", "", header, b"{}", 2)
    assert clustermgr.check("POST", "/config/set", "", signed(operator, "POST", "http://h/config/set"), b"{}", 2)
    blobnode = verifier((Role.DATA, Role.CONTROL))
    with pytest.raises(Unauthorized, match="takes no admin"):  # a blobnode never holds the admin key
        blobnode.check("POST", "/config/set", "", signed(operator, "POST", "http://h/config/set"), b"{}", 2)
    assert required_role("/health") is None and required_role("/metrics") is None


def test_shard_bodies_are_signed_by_length() -> None:
    signer = Signer(AuthConfig.for_roles(SECRET, [Role.DATA]).keys, clock=lambda: NOW)
    header = signed(signer, "POST", "http://h/shard/put?bid=3", body=b"x" * 1000)
    check = verifier().check
    assert check("POST", "/shard/put", "bid=3", header, None, 1000) is Role.DATA
    with pytest.raises(Unauthorized):
        check("POST", "/shard/put", "bid=3", header, None, 1001)


def test_rotation_accepts_old_and_new_keys_during_the_overlap() -> None:
    new = new_secret()
    rotating = Verifier(AuthConfig.for_roles(new, [Role.CONTROL], previous_secret=SECRET), clock=lambda: NOW)
    for secret in (SECRET, new):
        signer = Signer(AuthConfig.for_roles(secret, [Role.CONTROL]).keys, clock=lambda: NOW)
        assert rotating.check("GET", "/volume/list", "", signed(signer, "GET", "http://h/volume/list", body=None),
                              b"", 0) is Role.CONTROL
    after = Verifier(AuthConfig.for_roles(new, [Role.CONTROL]), clock=lambda: NOW)
    stale = Signer(AuthConfig.for_roles(SECRET, [Role.CONTROL]).keys, clock=lambda: NOW)
    with pytest.raises(Unauthorized):
        after.check("GET", "/volume/list", "", signed(stale, "GET", "http://h/volume/list", body=None), b"", 0)


def test_a_read_grant_reads_until_it_expires_and_can_do_nothing_else() -> None:
    blobnode = Verifier(AuthConfig.for_roles(SECRET, [Role.READ, Role.DATA, Role.CONTROL]), clock=lambda: NOW)
    operator = Signer(AuthConfig.for_roles(SECRET, Role).keys, clock=lambda: NOW)
    grant = operator.grant(Role.READ, 3600)
    assert grant.expires == NOW + 3600 and grant.key not in repr(grant)  # never printed by accident
    executor = Signer.from_grant(grant, clock=lambda: NOW)
    for path in ("/shard/get", "/shard/list", "/shard/stat", "/chunk/list", "/chunk/stat"):
        header = signed(executor, "GET", f"http://h{path}?vid=1", body=None)
        assert blobnode.check("GET", path, "vid=1", header, b"", 0) is Role.READ
    for path in ("/shard/put", "/shard/delete", "/shard/markdelete", "/chunk/create", "/chunk/release", "/stat"):
        body = None if path == "/shard/put" else b"{}"  # shard bytes are signed by their length
        with pytest.raises(Forbidden, match="not read"):
            blobnode.check("POST", path, "", signed(executor, "POST", f"http://h{path}"), body, 2)
    later = Verifier(AuthConfig.for_roles(SECRET, [Role.READ]), clock=lambda: NOW + 3601)
    with pytest.raises(Unauthorized, match="grant expired 1s ago"):
        later.check("GET", "/shard/get", "", signed(Signer.from_grant(grant, clock=lambda: NOW + 3601), "GET",
                                                    "http://h/shard/get", body=None), b"", 0)


def test_a_grant_cannot_be_stretched_forged_or_pushed_past_the_limit() -> None:
    blobnode = Verifier(AuthConfig.for_roles(SECRET, [Role.READ]), clock=lambda: NOW)
    operator = Signer(AuthConfig.for_roles(SECRET, Role).keys, clock=lambda: NOW)
    grant = operator.grant(Role.READ, 60)
    stretched = Signer.from_grant(Grant(Role.READ, grant.expires + 86400, grant.key), clock=lambda: NOW)
    promoted = Signer.from_grant(Grant(Role.DATA, grant.expires, grant.key), clock=lambda: NOW)
    stranger = Signer.from_grant(Signer(AuthConfig.for_roles(new_secret(), Role).keys, clock=lambda: NOW).grant(
        Role.READ, 60),
                                 clock=lambda: NOW)
    for signer in (stretched, stranger):
        with pytest.raises(Unauthorized, match="bad signature"):
            blobnode.check("GET", "/shard/get", "", signed(signer, "GET", "http://h/shard/get", body=None), b"", 0)
    with pytest.raises(Unauthorized, match="takes no data"):
        blobnode.check("GET", "/shard/get", "", signed(promoted, "GET", "http://h/shard/get", body=None), b"", 0)
    too_long = Signer.from_grant(operator.grant(Role.READ, MAX_GRANT + 60), clock=lambda: NOW)
    with pytest.raises(Unauthorized, match="may reach"):
        blobnode.check("GET", "/shard/get", "", signed(too_long, "GET", "http://h/shard/get", body=None), b"", 0)
    with pytest.raises(KeyError):  # a signer can only hand on a role it holds
        Signer(AuthConfig.for_roles(SECRET, [Role.DATA]).keys).grant(Role.READ, 60)
