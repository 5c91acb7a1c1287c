"""Client XML bodies: what boto3 sends parses; malformed, hostile and oversized bodies are MalformedXML."""

from __future__ import annotations

import pytest

from blobstore_server.services.s3.bodies import parse_complete, parse_create_bucket, parse_delete
from blobstore_server.services.s3.errors import S3Error

NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def test_complete_keeps_the_clients_order_and_etags_as_sent() -> None:
    body = (f'<CompleteMultipartUpload {NS}><Part><ETag>"aa"</ETag><PartNumber>2</PartNumber></Part>'
            "<Part><PartNumber>1</PartNumber><ETag>bb</ETag></Part></CompleteMultipartUpload>").encode()
    assert parse_complete(body) == [(2, '"aa"'), (1, "bb")]
    assert parse_complete(body.replace(NS.encode(), b"")) == [(2, '"aa"'), (1, "bb")]


@pytest.mark.parametrize("body", [
    b"", b"<CompleteMultipartUpload/>", b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part>"
    b"</CompleteMultipartUpload>", b"<CompleteMultipartUpload><Part><PartNumber>x</PartNumber><ETag>a</ETag></Part>"
    b"</CompleteMultipartUpload>", b"<Delete/>", b"<CompleteMultipartUpload>", b"not xml",
    b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
    b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&b;</ETag></Part></CompleteMultipartUpload>",
    b"<CompleteMultipartUpload>" + b"<Part><PartNumber>1</PartNumber><ETag>a</ETag></Part>" * 50_000
    + b"</CompleteMultipartUpload>",
])
def test_a_bad_complete_body_is_malformed_xml(body: bytes) -> None:
    with pytest.raises(S3Error) as err:
        parse_complete(body)
    assert err.value.code == "MalformedXML" and err.value.status == 400


def test_delete_reads_keys_as_utf8_bytes_and_quiet() -> None:
    body = (f"<Delete {NS}><Object><Key>a/€ b</Key></Object><Object><Key>c</Key><VersionId>null</VersionId>"
            "</Object><Quiet>true</Quiet></Delete>").encode()
    assert parse_delete(body) == (["a/€ b".encode(), b"c"], True)
    assert parse_delete(b"<Delete><Object><Key>k</Key></Object></Delete>") == ([b"k"], False)


def test_delete_is_bounded_and_refuses_versions() -> None:
    many = b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>"
    for body, code in ((many, "MalformedXML"), (b"<Delete></Delete>", "MalformedXML"),
                       (b"<Delete><Object><Key></Key></Object></Delete>", "MalformedXML"),
                       (b"<Delete><Object><Key>k</Key><VersionId>v1</VersionId></Object></Delete>", "NotImplemented")):
        with pytest.raises(S3Error) as err:
            parse_delete(body)
        assert err.value.code == code
    assert len(parse_delete(b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1000 + b"</Delete>")[0]) == 1000


def test_create_bucket_configuration() -> None:
    assert parse_create_bucket(b"") == ""
    assert parse_create_bucket(f"<CreateBucketConfiguration {NS}><LocationConstraint>z1</LocationConstraint>"
                               "</CreateBucketConfiguration>".encode()) == "z1"
    with pytest.raises(S3Error):
        parse_create_bucket(b"<Other/>")
