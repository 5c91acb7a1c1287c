"""The SparkSession both jobs run in: `local[*]` by default, or a standalone (or any) master, unchanged.

Spark's Kafka source and Hadoop's S3A connector are not part of pyspark: `make setup` fetches their jars from
Maven Central through the poms beside this file (pom.xml, s3a-pom.xml) into ~/.cache/blobstore
(deploy/spark/jars.py); a job never downloads anything. A session asked for them puts them on the classpath
(`spark.jars`, handed to the driver and every executor), without the jars pyspark already ships (Scala, Hadoop,
Netty, logging...), so pyspark's own versions win.

An https gateway (a cluster of several hosts) has a certificate of the cluster's own CA, which the JVM knows
only from a truststore: `_trust` writes one (PKCS12) from the CA and points the JVMs at it.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pyspark
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from pyspark.sql import SparkSession

from blobstore_server.libs.maven import cache_root, fetch_jars
from blobstore_server.libs.proto.blobnode import S3Access
from blobstore_server.libs.proto.export import s3a_options

POM = Path(__file__).resolve().parent / "pom.xml"
S3A_POM = POM.with_name("s3a-pom.xml")
PYSPARK_JARS = Path(pyspark.__file__).resolve().parent / "jars"
_VERSIONED = re.compile(r"^(?P<artifact>.+?)-\d[\w.+-]*\.jar$")
LOOPBACK = ("local", "spark://127.0.0.1:", "spark://localhost:")
KAFKA_SOURCE_JAR = "spark-sql-kafka-*.jar"
S3A_JAR = "hadoop-aws-*.jar"


def spark_version() -> str:
    match = re.search(r"<spark\.version>([^<]+)</spark\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <spark.version> in {POM}")
    if match.group(1) != pyspark.__version__:
        raise RuntimeError(f"{POM} fetches Spark {match.group(1)}'s Kafka source but pyspark is "
                           f"{pyspark.__version__}: change them together")
    return match.group(1)


def hadoop_version() -> str:
    """The hadoop-aws version s3a-pom.xml fetches, which must be the Hadoop pyspark ships."""
    match = re.search(r"<hadoop\.version>([^<]+)</hadoop\.version>", S3A_POM.read_text())
    if match is None:
        raise RuntimeError(f"no <hadoop.version> in {S3A_POM}")
    shipped = sorted(jar.name for jar in PYSPARK_JARS.glob("hadoop-client-api-*.jar"))
    if shipped != [f"hadoop-client-api-{match.group(1)}.jar"]:
        raise RuntimeError(f"{S3A_POM} fetches hadoop-aws {match.group(1)} but pyspark ships {shipped}: "
                           f"change them together")
    return match.group(1)


def _artifact(jar: Path) -> str:
    match = _VERSIONED.match(jar.name)
    return match.group("artifact") if match else jar.stem


def kafka_source_dir() -> Path:
    return cache_root() / f"spark-kafka-{spark_version()}" / "jars"


def fetch_kafka_source() -> Path:
    """Fetch the Kafka source's jars into the cache once (`make setup`; needs Maven)."""
    return fetch_jars(POM, kafka_source_dir(), KAFKA_SOURCE_JAR)


def s3a_dir() -> Path:
    return cache_root() / f"spark-s3a-{hadoop_version()}" / "jars"


def fetch_s3a() -> Path:
    """Fetch the S3A connector's jars into the cache once (`make setup`; needs Maven)."""
    return fetch_jars(S3A_POM, s3a_dir(), S3A_JAR)


def _beside_pyspark(what: str, libs: Path, expect: str) -> list[Path]:
    """The jars in `libs` that pyspark lacks, as `make setup` installed them."""
    if not any(libs.glob(expect)):
        raise FileNotFoundError(f"{what} is not installed (no {expect} in {libs}): "
                                f"run `make setup`, which fetches it with Maven")
    shipped = {_artifact(jar) for jar in PYSPARK_JARS.glob("*.jar")}
    return sorted(jar for jar in libs.glob("*.jar") if _artifact(jar) not in shipped)


def kafka_source_jars() -> list[Path]:
    """The Kafka source and the jars it needs that pyspark lacks."""
    return _beside_pyspark("Spark's Kafka source", kafka_source_dir(), KAFKA_SOURCE_JAR)


def s3a_jars() -> list[Path]:
    """Hadoop's S3A connector (s3a:// paths) and the AWS SDK modules it needs that pyspark lacks."""
    return _beside_pyspark("Hadoop's S3A connector", s3a_dir(), S3A_JAR)


@contextmanager
def spark_session(master: str, app_name: str, conf: Mapping[str, str] | None = None,
                  kafka_source: bool = False, s3a: bool = False, s3: S3Access | None = None) -> Iterator[SparkSession]:
    """A session on `master`, with Spark's Kafka source and S3A connector when asked (`s3`: s3a:// paths reach its
    endpoint as its user); stopped at the end unless one was already running in this process (a test or a notebook
    shares its own across jobs, started with the jars they need)."""
    existing = SparkSession.getActiveSession()
    if existing is not None:
        _reach(existing, s3)
        yield existing
        return
    # Executors run the same interpreter as the driver, so they import libs/ and spark/ as it does (pyspark
    # takes the executors' Python from this variable, not from blobstore_server.spark.pyspark.python).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.showConsoleProgress", "true")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith(LOOPBACK):  # everything on this machine: bind nothing but the loopback address
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    jars = (kafka_source_jars() if kafka_source else []) + (s3a_jars() if s3a or s3 else [])
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    if s3 is not None and s3.ca_file:  # executors in JVMs of their own (the truststore must be on their machine)
        options = " ".join(f"-D{k}={v}" for k, v in _trust(s3.ca_file).items())
        builder = builder.config("spark.executor.extraJavaOptions", options)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    _reach(session, s3)
    try:
        yield session
    finally:
        session.stop()


def _reach(session: SparkSession, s3: S3Access | None) -> None:
    """Point the session's s3a:// at `s3`, for the jobs run in it from now on. Hadoop caches a filesystem per bucket
    with the settings it was opened with: the cache is off for s3a, so a session that outlives a cluster (a test's,
    a notebook's) reaches the one it is pointed at now."""
    if s3 is None:
        return
    if s3.ca_file:  # the driver's JVM, and a local master's executors in it: read before the JVM's first TLS use
        system = session.sparkContext._jvm.java.lang.System  # type: ignore[union-attr]
        for key, value in _trust(s3.ca_file).items():
            system.setProperty(key, value)
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in {**s3a_options(s3), "fs.s3a.impl.disable.cache": "true"}.items():
        hadoop.set(key, value)


TRUSTSTORE_PASSWORD = "blobstore"  # the JDK wants one; the truststore holds only the CA's public certificate


def _trust(ca_file: str) -> dict[str, str]:
    """The JVM system properties that make the CA in `ca_file` (PEM) the JVM's trust: a PKCS12 truststore of it,
    written once per CA into the temporary folder."""
    pem = Path(ca_file).read_bytes()
    store = Path(tempfile.gettempdir()) / f"blobstore-ca-{hashlib.sha256(pem).hexdigest()[:16]}.p12"
    if not store.exists():
        certs = [pkcs12.PKCS12Certificate(cert, b"blobstore-ca") for cert in x509.load_pem_x509_certificates(pem)]
        body = pkcs12.serialize_java_truststore(
            certs, serialization.BestAvailableEncryption(TRUSTSTORE_PASSWORD.encode()))
        partial = store.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(body)
        partial.replace(store)
    return {"javax.net.ssl.trustStore": str(store), "javax.net.ssl.trustStoreType": "PKCS12",
            "javax.net.ssl.trustStorePassword": TRUSTSTORE_PASSWORD}
