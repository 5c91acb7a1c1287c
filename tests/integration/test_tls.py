"""A service over HTTPS with a self-signed certificate: clients that trust the cluster's CA talk to it,
others are refused, and plain HTTP gets nowhere."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from blobstore_server.libs.proto.ids import Vuid
from blobstore_server.libs.rpc import client as rpc_client
from blobstore_server.libs.rpc.errors import Unavailable
from blobstore_server.services.blobnode.client import BlobnodeClient
from tests.support.processes import Service, free_port


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_blobnode(tmp_path: Path, certificate: tuple[Path, Path], signed_as_operator: str) -> Iterator[str]:
    cert, key = certificate
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    config = {"bind_addr": f"127.0.0.1:{port}", "host": url, "disks": [{"path": str(tmp_path / "d"), "disk_id": 1}],
              "tls": {"cert_file": str(cert), "key_file": str(key), "ca_file": str(cert)}}
    node = Service("blobnode", config, tmp_path, url, verify=ssl.create_default_context(cafile=str(cert)))
    try:
        yield node.start().url
    finally:
        node.stop()


def test_https_for_clients_that_trust_the_ca(tls_blobnode: str, certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    vuid = Vuid.make(1, 0, 1)

    async def talk(ca: Path | None) -> bytes:
        rpc_client.trust(str(ca) if ca else None)
        try:
            async with BlobnodeClient() as bn:
                await bn.create_chunk(tls_blobnode, 1, vuid)
                await bn.put_shard(tls_blobnode, 1, vuid, 7, b"over tls")
                return await bn.get_shard(tls_blobnode, 1, vuid, 7)
        finally:
            rpc_client.trust(None)

    assert asyncio.run(talk(cert)) == b"over tls"
    with pytest.raises(Unavailable):  # the system's roots do not know a self-signed certificate
        asyncio.run(talk(None))
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_blobnode.replace("https://", "http://") + "/health", timeout=2)
