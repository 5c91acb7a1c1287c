"""The Raft transport's membership proof, both ways, over real localhost TCP: members talk; a dialer without
the key is hung up on; a member never sends a frame to a listener that cannot prove it holds the key; with TLS,
nothing moves in the clear and a listener with another CA's certificate is not talked to."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

from blobstore_server.cluster import pki
from blobstore_server.libs.raft.config import RaftTLS
from blobstore_server.libs.raft.messages import Message, PreVote
from blobstore_server.libs.raft.transport import CHALLENGE, Transport, split_addr
from blobstore_server.libs.rpc.auth import new_secret
from tests.support.waiting import eventually

KEY = os.urandom(32)


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_members_exchange_messages() -> None:
    async def scenario() -> None:
        got: list[Message] = []
        a, b = Transport(1, free_addr(), lambda m: None, KEY), Transport(2, free_addr(), got.append, KEY)
        await a.start()
        await b.start()
        try:
            a.set_peers({2: b.listen})
            await eventually(lambda: a.send(PreVote(term=1, frm=1, to=2)) and got, 5, "a message through", every=0.01)
            assert isinstance(got[0], PreVote) and got[0].frm == 1
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_member_sends_nothing_to_a_listener_without_the_key() -> None:
    async def scenario() -> None:
        received: list[bytes] = []
        answered = asyncio.Event()

        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(os.urandom(CHALLENGE))
            received.append(await reader.readexactly(32 + CHALLENGE))  # the member's answer and challenge
            writer.write(bytes(32))  # a wrong answer to the member's challenge
            answered.set()
            received.append(await reader.read(1 << 16))  # anything further: a frame would be a leak

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        member = Transport(1, free_addr(), lambda m: None, KEY)
        await member.start()
        try:
            member.set_peers({2: f"127.0.0.1:{port}"})
            await asyncio.wait_for(answered.wait(), 5)
            for _ in range(20):
                assert not member.send(PreVote(term=1, frm=1, to=2))
                await asyncio.sleep(0.02)
            await eventually(lambda: len(received) >= 2, 5, "two messages", every=0.01)
            assert received[1] == b""  # hung up on, with no frame sent
        finally:
            await member.close()
            server.close()

    asyncio.run(scenario())


def _tls(folder: Path, secret: str) -> RaftTLS:
    """A certificate for 127.0.0.1 from the CA of `secret`, as `cluster up --hosts` gives each host."""
    host = pki.host_certificates(secret, [("h1", "127.0.0.1")])["h1"]
    folder.mkdir()
    for name, text in ((pki.CA_FILE, host.ca), (pki.CERT_FILE, host.cert), (pki.KEY_FILE, host.key)):
        (folder / name).write_text(text)
    return RaftTLS(cert_file=str(folder / pki.CERT_FILE), key_file=str(folder / pki.KEY_FILE),
                   ca_file=str(folder / pki.CA_FILE))


def test_members_talk_over_tls_and_a_plain_dialer_gets_no_challenge(tmp_path: Path) -> None:
    """With TLS the member proof itself moves encrypted: a plain TCP dialer reads no challenge, its bytes end the
    connection; a member of another CA's cluster does not get past the handshake."""
    secret = new_secret()
    tls = _tls(tmp_path / "mine", secret)

    async def scenario() -> None:
        got: list[Message] = []
        a, b = Transport(1, free_addr(), lambda m: None, KEY, tls), Transport(2, free_addr(), got.append, KEY, tls)
        stranger = Transport(3, free_addr(), lambda m: None, KEY, _tls(tmp_path / "other", new_secret()))
        for t in (a, b, stranger):
            await t.start()
        try:
            a.set_peers({2: b.listen})
            await eventually(lambda: a.send(PreVote(term=1, frm=1, to=2)) and got, 5, "a message through", every=0.01)
            stranger.set_peers({2: b.listen})
            await asyncio.sleep(0.5)
            assert not stranger.send(PreVote(term=1, frm=3, to=2)), "its dialer refuses b's certificate"
            reader, writer = await asyncio.open_connection(*split_addr(b.listen))
            with contextlib.suppress(TimeoutError):
                assert await asyncio.wait_for(reader.read(CHALLENGE), 0.5) == b"", "no challenge in the clear"
            writer.write(os.urandom(32 + CHALLENGE))
            assert await asyncio.wait_for(reader.read(1 << 16), 5) == b"", "not TLS: hung up on"
            writer.close()
            assert all(m.frm == 1 for m in got)
        finally:
            for t in (a, b, stranger):
                await t.close()

    asyncio.run(scenario())
