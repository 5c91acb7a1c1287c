"""The cluster's certificates: a client trusting the cluster CA completes a TLS handshake with a host's certificate
for its IP address; one trusting another cluster's CA, or dialing another address, is refused."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from blobstore_server.cluster.pki import HostTLS, ca_certificate, host_certificates

SECRET = "11" * 32
OTHER = "22" * 32


def host_tls(secret: str, name: str, address: str, now: datetime.datetime | None = None) -> HostTLS:
    return host_certificates(secret, [(name, address)], now)[name]


def _server(tls_dir: Path, secret: str) -> ssl.SSLContext:
    files = host_tls(secret, "h1", "127.0.0.1")
    (tls_dir / "cert.pem").write_text(files.cert)
    (tls_dir / "key.pem").write_text(files.key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_dir / "cert.pem", tls_dir / "key.pem")
    return context


async def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, dial: str) -> bytes:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server)
    port = listener.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=dial)
        data = await reader.read()
        writer.close()
        return data
    finally:
        listener.close()


def test_a_client_trusting_the_ca_talks_to_a_host(tmp_path: Path) -> None:
    client = ssl.create_default_context(cadata=host_tls(SECRET, "h1", "127.0.0.1").ca)
    assert asyncio.run(_handshake(_server(tmp_path, SECRET), client, "127.0.0.1")) == b"hello"


@pytest.mark.parametrize(("trusted", "dial"), [(OTHER, "127.0.0.1"), (SECRET, "127.0.0.2")],
                         ids=["another-clusters-ca", "another-address"])
def test_a_wrong_ca_or_address_is_refused(tmp_path: Path, trusted: str, dial: str) -> None:
    client = ssl.create_default_context(cadata=ca_certificate(trusted))
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_handshake(_server(tmp_path, SECRET), client, dial))


def test_rendering_again_keeps_the_keys_and_old_trust(tmp_path: Path) -> None:
    """A host certificate rendered a year later verifies under the CA certificate rendered today."""
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    first, second = host_tls(SECRET, "h1", "127.0.0.1"), host_tls(SECRET, "h1", "127.0.0.1", now=later)
    assert first.key == second.key
    ca = x509.load_pem_x509_certificate(first.ca.encode())
    renewed = x509.load_pem_x509_certificate(second.cert.encode())
    renewed.verify_directly_issued_by(ca)
