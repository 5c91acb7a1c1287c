"""TLS on a cluster of several hosts (`cluster up --hosts`, as `deploy render` bundles it): every HTTP service
answers over https only, with a certificate of the cluster's CA; the SDK talks to it only when given that CA; the
clustermgrs' Raft port speaks TLS before anything else, and still asks a client it trusts for the member proof."""

from __future__ import annotations

import json
import os
import socket
import ssl
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from blobstore import Client, Unavailable
from blobstore_server.cli.cli import app
from blobstore_server.cluster.launcher import ClusterInfo
from blobstore_server.cluster.plan import ROLES
from blobstore_server.libs.raft.transport import CHALLENGE, split_addr
from tests.support.launched import SIX_HOSTS, SMALL

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)
pytestmark = pytest.mark.skipif(not SIX_HOSTS, reason="hosts as network namespaces need root")

MiB = 1 << 20


def test_every_http_process_serves_https_only(cluster: ClusterInfo) -> None:
    done = CliRunner().invoke(app, ["cluster", "status", "--json", "--dir", cluster.dir])
    assert done.exit_code == 0, done.output
    served = [p for p in json.loads(done.output)["processes"] if p["role"] not in ("redis", "kafka")]
    assert {p["role"] for p in served} == set(ROLES.values())
    for p in served:
        assert p["url"].startswith("https://") and p["healthy"], p
        with pytest.raises(httpx.HTTPError):  # the listener wants a TLS handshake first
            httpx.get(p["url"].replace("https://", "http://") + "/health", timeout=5)


def test_the_sdk_talks_to_the_cluster_only_with_its_ca(cluster: ClusterInfo) -> None:
    with Client(cluster.access_urls) as untrusting, pytest.raises(Unavailable) as refused:
        untrusting.put(b"not sent")
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value) and "ca=" in str(refused.value)
    data = os.urandom(5 * MiB + 1)  # large: read from the blobnodes directly, over https too
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        location = client.put(data)
        assert client.get(location) == data
        assert client.get(location, 7, 100) == data[7:107]


def _raft_addr(cluster: ClusterInfo) -> tuple[str, int]:
    clustermgr = next(p for p in cluster.processes if p.role == "clustermgr")
    config = json.loads(Path(clustermgr.config).read_text())
    return split_addr(config["members"][str(config["node_id"])]["raft_addr"])


def test_the_raft_port_speaks_tls_first_and_then_asks_for_the_member_proof(cluster: ClusterInfo) -> None:
    host, port = _raft_addr(cluster)
    with socket.create_connection((host, port), timeout=5) as plain:
        plain.settimeout(1.0)
        with pytest.raises(TimeoutError):  # in the clear, the challenge of the member proof would come first
            plain.recv(CHALLENGE)
        plain.sendall(os.urandom(32 + CHALLENGE))  # an answer, as if the challenge had come: not TLS
        plain.settimeout(5.0)
        reply = plain.recv(1 << 16)
        assert reply == b"" or reply[0] == 0x15, reply  # hung up on, at most after a TLS alert
    with socket.create_connection((host, port), timeout=5) as raw, pytest.raises(ssl.SSLCertVerificationError):
        ssl.create_default_context().wrap_socket(raw, server_hostname=host)  # the system's roots: not the CA
    assert cluster.ca is not None
    with socket.create_connection((host, port), timeout=5) as raw, \
            ssl.create_default_context(cafile=cluster.ca).wrap_socket(raw, server_hostname=host) as tls:
        challenge = b""
        while len(challenge) < CHALLENGE:
            piece = tls.recv(CHALLENGE - len(challenge))
            assert piece, "hung up before the challenge"
            challenge += piece
