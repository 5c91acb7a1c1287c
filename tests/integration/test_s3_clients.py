"""The clients people point at an S3 endpoint, run against the gateway as they run them: the aws CLI (v1, from
PyPI, in a venv of its own), Debian's rclone, and s3fs under pandas. Path-style addressing. Each command's exit
code and output are checked, and what the bucket holds afterwards is read back through boto3."""

from __future__ import annotations

import base64
import os
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import s3fs
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import REPO, LocalCluster
from tests.support.s3 import Gateway, running_gateway

AWS = REPO / ".venv" / "awscli" / "bin" / "aws"
RCLONE = Path("/usr/bin/rclone")
MiB = 1 << 20
TIMEOUT = 60.0  # seconds a client command may take before the test fails (subprocess.run kills it)


@pytest.fixture(scope="module")
def gateway(shared_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway on the module's cluster: each test has a user and a bucket of its own."""
    with running_gateway(shared_cluster, tmp_path_factory.mktemp("s3")) as started:
        yield started


def _server_errors(url: str) -> dict[tuple[str, str], float]:
    """How many 5xx answers the gateway gave, by (operation, status)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {(found.labels["route"], found.labels["status"]): found.value
            for family in text_string_to_metric_families(text) for found in family.samples
            if found.name == "blobstore_http_requests_total" and found.labels.get("status", "").startswith("5")}


@pytest.fixture(autouse=True)
def answered_without_server_errors(gateway: Gateway) -> Iterator[None]:
    """A client that meets a 501 may fall back quietly: every test also checks the gateway never answered 5xx."""
    before = _server_errors(gateway.url)
    yield
    assert _server_errors(gateway.url) == before


@dataclass
class Account:
    """A user of the gateway: its keys, boto3 as that user (to see what the store holds) and a bucket name."""

    gateway: Gateway
    access_key: str
    secret: str
    bucket: str

    @property
    def s3(self) -> Any:
        return self.gateway.client(self.access_key, self.secret)

    def stored(self, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix` (key -> bytes), read back through boto3."""
        s3 = self.s3
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
        return {key: s3.get_object(Bucket=self.bucket, Key=key)["Body"].read() for key in keys}


@pytest.fixture
def account(gateway: Gateway) -> Account:
    suffix = os.urandom(4).hex()
    return Account(gateway, *gateway.user(f"u{suffix}"), f"b{suffix}")


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A client's environment: nothing of the machine's AWS_* settings (a CA bundle rclone refuses over plain
    HTTP), nor of its home directory's configs."""
    home.mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LC_ALL": "C.UTF-8", "TZ": "UTC", **extra}


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end (killed after TIMEOUT); output as text, any bytes that are not UTF-8 kept as
    surrogates."""
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, encoding="utf-8", errors="surrogateescape",
                          timeout=TIMEOUT, check=False)


@dataclass
class AwsCli:
    """The aws CLI as one user, its config file saying path-style and nothing else."""

    account: Account
    home: Path

    def __post_init__(self) -> None:
        config = self.home / "config"
        self.env = _clean_env(self.home, AWS_CONFIG_FILE=str(config),
                              AWS_SHARED_CREDENTIALS_FILE=str(self.home / "credentials"),
                              AWS_ACCESS_KEY_ID=self.account.access_key, AWS_SECRET_ACCESS_KEY=self.account.secret,
                              AWS_DEFAULT_REGION="us-east-1")
        config.write_text("[default]\ns3 =\n    addressing_style = path\n")

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(AWS), "--endpoint-url", self.account.gateway.url, *args], self.env, self.home.parent)

    def ok(self, *args: str) -> str:
        """The command's standard output, once it exited 0."""
        done = self(*args)
        assert done.returncode == 0, f"aws {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout


@dataclass
class Rclone:
    """rclone with one remote, `gw:`, configured through the environment as rclone's docs show for S3 'Other'."""

    account: Account
    home: Path

    def __post_init__(self) -> None:
        config = self.home / "rclone.conf"
        remote = {"TYPE": "s3", "PROVIDER": "Other", "ENDPOINT": self.account.gateway.url, "REGION": "us-east-1",
                  "ACCESS_KEY_ID": self.account.access_key, "SECRET_ACCESS_KEY": self.account.secret,
                  "FORCE_PATH_STYLE": "true"}
        self.env = _clean_env(self.home, RCLONE_CONFIG=str(config),
                              **{f"RCLONE_CONFIG_GW_{name}": value for name, value in remote.items()})
        config.touch()  # an empty config: rclone says no more that it found none

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run([str(RCLONE), *args], self.env, self.home.parent)

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = self(*args)
        assert done.returncode == 0, f"rclone {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def _tree(root: Path) -> dict[str, bytes]:
    """A directory's files (relative POSIX path -> bytes)."""
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()}


def _under(prefix: str, files: dict[str, bytes]) -> dict[str, bytes]:
    return {prefix + name: data for name, data in files.items()}


TREE = {"top.txt": b"top\n", "a/x.txt": b"x" * 1000, "a/b/deep.bin": os.urandom(70_000),
        "c/with space+plus €.txt": b"odd names travel too\n", "empty": b""}


def test_aws_cli_copies_a_multipart_file_and_a_small_one_up_and_down(account: Account, tmp_path: Path) -> None:
    aws, bucket = AwsCli(account, tmp_path / "home"), account.bucket
    assert aws.ok("s3", "mb", f"s3://{bucket}").strip() == f"make_bucket: {bucket}"
    big, small = os.urandom(20 * MiB + 123), b"hello from the aws CLI\n"
    _write_tree(tmp_path, {"big.bin": big, "small.txt": small})
    aws.ok("s3", "cp", "--no-progress", str(tmp_path / "big.bin"), f"s3://{bucket}/data/big.bin")
    aws.ok("s3", "cp", "--no-progress", str(tmp_path / "small.txt"), f"s3://{bucket}/small.txt")

    assert account.stored() == {"data/big.bin": big, "small.txt": small}
    head = account.s3.head_object(Bucket=bucket, Key="data/big.bin")
    assert head["ETag"].endswith('-3"')  # the CLI's 8 MiB parts: a multipart upload
    listed = aws.ok("s3", "ls", f"s3://{bucket}").splitlines()
    assert [line.split()[-1] for line in listed] == ["data/", "small.txt"] and listed[0].split() == ["PRE", "data/"]
    recursive = [line.split() for line in aws.ok("s3", "ls", "--recursive", f"s3://{bucket}").splitlines()]
    assert [(words[-2], words[-1]) for words in recursive] == [(str(len(big)), "data/big.bin"),
                                                               (str(len(small)), "small.txt")]

    aws.ok("s3", "cp", "--no-progress", f"s3://{bucket}/data/big.bin", str(tmp_path / "big.down"))
    assert (tmp_path / "big.down").read_bytes() == big
    assert aws.ok("s3", "cp", f"s3://{bucket}/small.txt", "-") == small.decode()
    # the CLI asks for CRC32s: each part's, and the object's is S3's composite of them
    parts = [zlib.crc32(big[start:start + 8 * MiB]).to_bytes(4, "big") for start in range(0, len(big), 8 * MiB)]
    composite = base64.b64encode(zlib.crc32(b"".join(parts)).to_bytes(4, "big")).decode() + "-3"
    described = aws.ok("s3api", "head-object", "--bucket", bucket, "--key", "data/big.bin", "--checksum-mode",
                       "ENABLED", "--query", "[ContentLength, ETag, ChecksumCRC32, ChecksumType]", "--output", "text")
    assert described.split() == [str(len(big)), head["ETag"], composite, "COMPOSITE"]

    url = aws.ok("s3", "presign", f"s3://{bucket}/small.txt", "--expires-in", "60").strip()
    assert "Signature=" in url and httpx.get(url).content == small  # signature version 2: the CLI v1's default


def test_aws_cli_sync_uploads_only_what_changed_and_rm_recursive_empties_the_prefix(account: Account,
                                                                                     tmp_path: Path) -> None:
    aws, bucket = AwsCli(account, tmp_path / "home"), account.bucket
    aws.ok("s3", "mb", f"s3://{bucket}")
    source = tmp_path / "source"
    _write_tree(source, TREE)
    target = f"s3://{bucket}/backup"

    first = aws.ok("s3", "sync", "--no-progress", str(source), target).splitlines()
    assert sorted(line.split(" to ")[1] for line in first) == sorted(f"{target}/{name}" for name in TREE)
    assert account.stored("backup/") == _under("backup/", TREE)
    assert aws.ok("s3", "sync", "--no-progress", str(source), target) == ""  # nothing changed, nothing sent

    (source / "a/x.txt").write_bytes(b"changed, and longer than before" * 100)
    again = aws.ok("s3", "sync", "--no-progress", str(source), target).splitlines()
    assert again == [f"upload: {source.name}/a/x.txt to {target}/a/x.txt"]
    assert account.stored("backup/a/x.txt") == {"backup/a/x.txt": (source / "a/x.txt").read_bytes()}

    down = tmp_path / "down"
    aws.ok("s3", "sync", "--no-progress", target, str(down))
    assert _tree(down) == _tree(source)

    (source / "top.txt").unlink()
    deleted = aws.ok("s3", "sync", "--no-progress", "--delete", str(source), target).splitlines()
    assert deleted == [f"delete: {target}/top.txt"] and "backup/top.txt" not in account.stored("backup/")

    removed = aws.ok("s3", "rm", "--recursive", target).splitlines()
    assert len(removed) == len(TREE) - 1 and all(line.startswith(f"delete: {target}/") for line in removed)
    assert account.stored() == {}
    empty = aws("s3", "ls", "--recursive", f"s3://{bucket}/backup/")
    assert empty.returncode == 1 and empty.stdout == ""  # the CLI's answer to a listing with nothing in it
    assert aws.ok("s3", "rb", f"s3://{bucket}").strip() == f"remove_bucket: {bucket}"
    assert account.s3.list_buckets()["Buckets"] == []


def test_rclone_copy_check_and_sync(account: Account, tmp_path: Path) -> None:
    rclone, bucket = Rclone(account, tmp_path / "home"), account.bucket
    source = tmp_path / "source"
    _write_tree(source, TREE)
    remote = f"gw:{bucket}/tree"

    rclone.ok("mkdir", f"gw:{bucket}")
    rclone.ok("copy", str(source), remote)
    assert account.stored() == _under("tree/", TREE)
    checked = rclone.ok("check", str(source), remote)  # sizes and MD5s (the ETags) of every file
    assert "0 differences found" in checked.stderr and f"{len(TREE)} matching files" in checked.stderr
    assert sorted(rclone.ok("lsf", "-R", "--files-only", remote).stdout.splitlines()) == sorted(TREE)

    (source / "a/x.txt").unlink()
    (source / "new.txt").write_bytes(b"new\n")
    rclone.ok("sync", str(source), remote)
    assert account.stored() == _under("tree/", _tree(source))
    rclone.ok("check", str(source), remote)

    # only the time changed: rclone rewrites its mtime metadata in place (a copy of the object onto itself)
    old = datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    os.utime(source / "top.txt", (old, old))
    touched = rclone.ok("sync", "-v", str(source), remote)
    assert "top.txt: Updated modification time in destination" in touched.stderr
    assert rclone.ok("lsl", f"{remote}/top.txt").stdout.split()[:3] == ["4", "2020-01-02", "03:04:05.000000000"]
    assert account.stored("tree/top.txt") == {"tree/top.txt": TREE["top.txt"]}

    (source / "a/b/deep.bin").write_bytes(os.urandom(len(TREE["a/b/deep.bin"])))  # the same size: MD5s differ
    differs = rclone("check", str(source), remote)
    assert differs.returncode == 1 and "1 differences found" in differs.stderr

    moved = rclone.ok("moveto", "-v", f"{remote}/new.txt", f"gw:{bucket}/moved.txt")
    assert "Copied (server-side copy)" in moved.stderr
    assert set(account.stored()) == {"moved.txt", *_under("tree/", TREE)} - {"tree/a/x.txt"}

    down = tmp_path / "down"
    rclone.ok("copy", remote, str(down))
    assert _tree(down) == {name.removeprefix("tree/"): data for name, data in account.stored("tree/").items()}


def test_rclone_multipart_upload_checks_out(account: Account, tmp_path: Path) -> None:
    """Over its upload cutoff rclone sends parts: the ETag is then no MD5, so rclone keeps the MD5 in metadata
    (X-Amz-Meta-Md5chksum) and `check` compares that."""
    rclone, bucket = Rclone(account, tmp_path / "home"), account.bucket
    source = tmp_path / "source"
    big = os.urandom(12 * MiB)
    _write_tree(source, {"big.bin": big, "small.txt": b"small\n"})
    rclone.ok("mkdir", f"gw:{bucket}")
    rclone.ok("copy", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", str(source), f"gw:{bucket}")

    head = account.s3.head_object(Bucket=bucket, Key="big.bin")
    assert head["ETag"].endswith('-3"') and head["ContentLength"] == len(big) and "md5chksum" in head["Metadata"]
    assert account.stored() == {"big.bin": big, "small.txt": b"small\n"}
    checked = rclone.ok("check", str(source), f"gw:{bucket}")
    assert "0 differences found" in checked.stderr and "2 matching files" in checked.stderr
    assert rclone.ok("check", "--download", str(source), f"gw:{bucket}").returncode == 0
    piece = subprocess.run([str(RCLONE), "cat", "--offset", str(6 * MiB - 5), "--count", "10", f"gw:{bucket}/big.bin"],
                           env=rclone.env, capture_output=True, check=True, timeout=60).stdout  # bytes: no \r -> \n
    assert piece == big[6 * MiB - 5:6 * MiB + 5]


@pytest.fixture
def fs(account: Account) -> tuple[s3fs.S3FileSystem, dict[str, Any]]:
    """s3fs as the user, no listings cached (each read sees the store), and the storage_options pandas takes."""
    options: dict[str, Any] = {
        "key": account.access_key, "secret": account.secret, "use_listings_cache": False,
        "client_kwargs": {"endpoint_url": account.gateway.url, "region_name": "us-east-1"},
        "config_kwargs": {"s3": {"addressing_style": "path"}}}
    return s3fs.S3FileSystem(skip_instance_cache=True, **options), options


def test_pandas_writes_and_reads_parquet_through_s3fs(account: Account,
                                                      fs: tuple[s3fs.S3FileSystem, dict[str, Any]]) -> None:
    filesystem, options = fs
    bucket = account.bucket
    filesystem.mkdir(bucket)
    rows = 200_000
    frame = pd.DataFrame({"id": np.arange(rows), "value": np.random.default_rng(7).random(rows),
                          "name": [f"row {i}" for i in range(rows)]})
    frame.to_parquet(f"s3://{bucket}/tables/t.parquet", storage_options=options)
    assert pd.read_parquet(f"s3://{bucket}/tables/t.parquet", storage_options=options).equals(frame)
    only = pd.read_parquet(f"s3://{bucket}/tables/t.parquet", columns=["value"], storage_options=options)
    assert only["value"].equals(frame["value"])
    stored = account.stored()
    assert list(stored) == ["tables/t.parquet"] and stored["tables/t.parquet"][:4] == b"PAR1"


def test_s3fs_lists_reads_ranges_and_writes_in_parts(account: Account, fs: tuple[s3fs.S3FileSystem, dict[str, Any]],
                                                     tmp_path: Path) -> None:
    filesystem, _ = fs
    bucket = account.bucket
    filesystem.mkdir(bucket)
    data = os.urandom(3 * MiB + 17)
    filesystem.pipe(f"{bucket}/dir/data.bin", data)
    filesystem.pipe(f"{bucket}/dir/sub/note.txt", b"note")
    filesystem.pipe(f"{bucket}/top.txt", b"top")

    assert sorted(filesystem.ls(bucket)) == [f"{bucket}/dir", f"{bucket}/top.txt"]
    detail = {entry["name"]: entry for entry in filesystem.ls(f"{bucket}/dir", detail=True)}
    assert detail[f"{bucket}/dir/data.bin"]["size"] == len(data) and detail[f"{bucket}/dir/sub"]["type"] == "directory"
    assert filesystem.isdir(f"{bucket}/dir/sub") and filesystem.isfile(f"{bucket}/top.txt")
    assert not filesystem.exists(f"{bucket}/nothing")
    assert filesystem.find(bucket) == [f"{bucket}/dir/data.bin", f"{bucket}/dir/sub/note.txt", f"{bucket}/top.txt"]

    with filesystem.open(f"{bucket}/dir/data.bin", "rb", block_size=256 * 1024) as f:
        f.seek(MiB - 10)
        assert f.read(100) == data[MiB - 10:MiB + 90]
        f.seek(-17, os.SEEK_END)
        assert f.read() == data[-17:]
    assert filesystem.cat_file(f"{bucket}/dir/data.bin", start=2 * MiB, end=2 * MiB + 5) == data[2 * MiB:2 * MiB + 5]

    big = os.urandom(12 * MiB + 5)
    with filesystem.open(f"{bucket}/parts.bin", "wb", block_size=5 * MiB) as f:
        for offset in range(0, len(big), MiB):
            f.write(big[offset:offset + MiB])
    assert account.s3.head_object(Bucket=bucket, Key="parts.bin")["ETag"].endswith('-3"')
    assert filesystem.cat_file(f"{bucket}/parts.bin") == big

    _write_tree(tmp_path / "tree", TREE)
    filesystem.put(f"{tmp_path / 'tree'}/", f"{bucket}/put/", recursive=True)
    assert account.stored("put/") == _under("put/", TREE)
    filesystem.get(f"{bucket}/put/", f"{tmp_path / 'got'}/", recursive=True)
    assert _tree(tmp_path / "got") == TREE

    filesystem.rm(f"{bucket}/dir", recursive=True)
    filesystem.rm(f"{bucket}/put", recursive=True)
    assert list(account.stored()) == ["parts.bin", "top.txt"]


def test_pyarrows_own_s3_filesystem_writes_and_reads_parquet(account: Account) -> None:
    """pyarrow's S3FileSystem (the AWS C++ SDK: every file a multipart upload, an x-amz-checksum-crc64nvme on every
    part, checked here; it was answered 501 before): a small file, a bigger one and a stream of several parts."""
    account.s3.create_bucket(Bucket=account.bucket)
    s3 = pafs.S3FileSystem(access_key=account.access_key, secret_key=account.secret, region="us-east-1",
                           scheme="http", endpoint_override=account.gateway.url.removeprefix("http://"))
    rows = 300_000
    table = pa.table({"id": np.arange(rows), "noise": np.random.default_rng(3).random(rows)})
    for name, size in (("small.parquet", 1000), ("big.parquet", rows)):
        pq.write_table(table.slice(0, size), f"{account.bucket}/{name}", filesystem=s3)
        assert pq.read_table(f"{account.bucket}/{name}", filesystem=s3).equals(table.slice(0, size))
    with s3.open_output_stream(f"{account.bucket}/raw.bin") as out:  # 12 MiB: more than one part
        payload = os.urandom(12 << 20)
        out.write(payload)
    assert account.stored("raw")["raw.bin"] == payload
