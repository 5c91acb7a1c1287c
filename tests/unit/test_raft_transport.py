"""The Raft transport's membership proof, both ways, over real localhost TCP: members talk; a dialer without
the key is hung up on; a member never sends a frame to a listener that cannot prove it holds the key."""

from __future__ import annotations

import asyncio
import os
import socket

from blobstore_server.libs.raft.messages import Message, PreVote
from blobstore_server.libs.raft.transport import CHALLENGE, Transport
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
