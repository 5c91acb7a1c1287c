"""The cluster's TLS certificates: a CA and one certificate per host, made with `cryptography`. I/O-free.

Every key derives from the cluster secret (as every other key of a rendered cluster does), so rendering a spec
again gives the same keys: a certificate signed by a re-rendered CA verifies under the CA certificate a host
already holds (same key, same name). The CA's private key is never written to a host; each host gets the CA
certificate (what it trusts), its own certificate (for its address and name) and its key.

ECDSA P-256 rather than Ed25519: Kafka's JVM and the JDK's PEM/PKCS12 loaders, Redis and every Python client take it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.pem"  # the cluster CA's certificate: what every process and the operator's CLI trust
CERT_FILE = "tls-cert.pem"  # a host's certificate
KEY_FILE = "tls-key.pem"  # its private key (mode 0600)
VALIDITY = datetime.timedelta(days=3650)  # re-render (same keys) to renew
_CURVE_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # of P-256


@dataclass(frozen=True)
class HostTLS:
    """What one host holds, as PEM text."""

    ca: str
    cert: str
    key: str


def _key(secret: str, purpose: str) -> ec.EllipticCurvePrivateKey:
    seed = hmac.digest(bytes.fromhex(secret), f"blobstore tls {purpose}".encode(), hashlib.sha256)
    return ec.derive_private_key(int.from_bytes(seed, "big") % (_CURVE_ORDER - 1) + 1, ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "blobstore"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


_CA_NAME = _name("blobstore cluster CA")


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _ca(secret: str, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key(secret, "cluster ca")
    public = key.public_key()
    cert = (x509.CertificateBuilder().subject_name(_CA_NAME).issuer_name(_CA_NAME).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def ca_certificate(secret: str, now: datetime.datetime | None = None) -> str:
    """The CA certificate (PEM) the operator's CLI and SDK trust."""
    return _pem(_ca(secret, now or datetime.datetime.now(datetime.UTC))[0])


def host_certificates(secret: str, hosts: Sequence[tuple[str, str]],
                      now: datetime.datetime | None = None) -> dict[str, HostTLS]:
    """For each host `(name, IP address)`: the CA certificate (one for all) and a certificate for its address and
    name (both in its subjectAltName, for server and client use), with its key."""
    now = now or datetime.datetime.now(datetime.UTC)
    ca, ca_key = _ca(secret, now)
    return {name: HostTLS(_pem(ca), _pem(_host_certificate(secret, name, address, ca_key, now)),
                          _key(secret, f"host {name}").private_bytes(
                              serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())
            for name, address in hosts}


def _host_certificate(secret: str, name: str, address: str, ca_key: ec.EllipticCurvePrivateKey,
                      now: datetime.datetime) -> x509.Certificate:
    public = _key(secret, f"host {name}").public_key()
    return (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_CA_NAME).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address)),
                                                        x509.DNSName(name)]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
