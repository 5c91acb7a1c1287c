"""The Kafka `cluster up` starts takes SASL/SCRAM logins only, and each service's user may do only its part
(cluster/kafka_auth.py): without a login a client writes and reads nothing, tinker's and the backlog's users
cannot queue a delete, and the cluster still deletes through access and reports its lag."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError
from typer.testing import CliRunner

from blobstore import Client, NotFound
from blobstore_server.cli.cli import app
from blobstore_server.cluster.kafka_auth import kafka_user
from blobstore_server.cluster.launcher import SECRET_FILE, ClusterInfo, cluster_ca
from blobstore_server.cluster.plan import KAFKA_PARTITIONS
from blobstore_server.libs.mq.settings import KafkaAuth, client_auth
from blobstore_server.libs.mq.topics import Topic
from tests.support.launched import SMALL

LAUNCH = SMALL  # the launched `cluster` (tests/conftest.py)


def login(cluster: ClusterInfo, user: str) -> KafkaAuth:
    """`user`'s login, over TLS (trusting the cluster CA) on a cluster of several hosts."""
    return kafka_user((Path(cluster.dir) / SECRET_FILE).read_text().strip(), user, cluster_ca(Path(cluster.dir)))


def produce(cluster: ClusterInfo, auth: KafkaAuth | None, topic: str, **config: Any) -> KafkaError | None:
    """One record, as a service's producer sends it (idempotent unless `config` says otherwise); its error."""
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "enable.idempotence": True,
                                         "message.timeout.ms": 6000, **client_auth(auth), **config})
    errors: list[KafkaError | None] = []
    try:
        producer.produce(topic, b'{"vid": 1, "bid": 1}', on_delivery=lambda error, _: errors.append(error))
        producer.flush(10)
    except (confluent_kafka.KafkaException, SystemError) as exc:  # a fatal error (no idempotence PID) raised
        # by flush, as itself or as the cause of a SystemError around the delivery callback
        fatal = exc if isinstance(exc, confluent_kafka.KafkaException) else exc.__cause__
        assert isinstance(fatal, confluent_kafka.KafkaException), exc
        return fatal.args[0]  # type: ignore[no-any-return]
    finally:  # end its client now: left to the collector (the exception's cycle), it reconnects for the rest
        # of the run to this module's brokers, long gone
        producer.purge()
        producer.close()
    assert len(errors) == 1
    return errors[0]


def reads_any(cluster: ClusterInfo, auth: KafkaAuth | None, group: str, topic: str, seconds: float = 6.0, *,
              join: bool = True) -> bool:
    """Whether a consumer in `group` reads a record from the start of `topic` within `seconds`: a member of the
    group if `join`, else reading its partitions as the backlog does (assigned, in no group)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                         **client_auth(auth)})
    try:
        if join:
            consumer.subscribe([topic])
        else:
            consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                             for p in range(KAFKA_PARTITIONS)])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if any(m.error() is None for m in consumer.consume(100, timeout=0.5)):
                return True
        return False
    finally:
        consumer.close()


def reads_none(cluster: ClusterInfo, *readers: tuple[KafkaAuth | None, str, bool]) -> bool:
    """Whether no reader (login, group, join) reads anything: all watched at once, each for its whole window."""
    with ThreadPoolExecutor(len(readers)) as pool:
        read = pool.map(lambda r: reads_any(cluster, r[0], r[1], Topic.BLOB_DELETE, join=r[2]), readers)
        return not any(list(read))


def test_without_a_login_kafka_gives_nothing(cluster: ClusterInfo) -> None:
    with Client(cluster.access_urls, ca=cluster.ca) as client:  # there is something to read: a delete went through
        client.delete(client.put(b"queued"))
    wrong = login(cluster, "mqproxy").model_copy(update={"password": "0" * 64})
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    with ThreadPoolExecutor(4) as pool:  # each refusal shows as a timeout: wait them out together
        anonymous = pool.submit(produce, cluster, None, Topic.BLOB_DELETE)
        impostor = pool.submit(produce, cluster, wrong, Topic.BLOB_DELETE)
        unread = pool.submit(reads_none, cluster, (None, "intruder", True), (None, "intruder", False))
        listing = pool.submit(admin.list_topics, timeout=3)
        assert anonymous.result() is not None and impostor.result() is not None and unread.result()
        with pytest.raises(confluent_kafka.KafkaException):
            listing.result()
    assert reads_any(cluster, login(cluster, "backlog"), "backlog", Topic.BLOB_DELETE, join=False)  # it was there


def test_each_user_may_do_only_its_part(cluster: ClusterInfo) -> None:
    tinker, backlog, mqproxy = (login(cluster, user) for user in ("tinker", "backlog", "mqproxy"))
    refused = produce(cluster, tinker, Topic.BLOB_DELETE)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    refused = produce(cluster, backlog, Topic.BLOB_DELETE_FAILED, **{"enable.idempotence": False})
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    refused = produce(cluster, backlog, Topic.BLOB_DELETE)  # idempotent: not even a producer id
    assert refused is not None and refused.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, refused
    assert reads_none(cluster, (mqproxy, "mqproxy", False),  # it writes, never reads
                      (backlog, "tinker-delete", True),  # it cannot join tinker's group
                      (tinker, "not-tinkers", True))  # only in its own groups


def test_the_cluster_deletes_through_tinker_and_reports_its_lag(cluster: ClusterInfo) -> None:
    with Client(cluster.access_urls, ca=cluster.ca) as client:
        location = client.put(b"soon gone")
        client.delete(location)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.get(location)
            except NotFound:
                break
            assert time.monotonic() < deadline, "tinker did not delete the blob"
            time.sleep(0.3)
    result = CliRunner().invoke(app, ["queue", "stats", "--json", "--dir", cluster.dir])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert set(stats["delete"]["lag"]) == {Topic.BLOB_DELETE, Topic.BLOB_DELETE_FAILED}
    assert stats["delete"]["done"] >= 1
