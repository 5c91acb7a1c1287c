"""Jobs never download: Spark's Kafka source comes from `make setup`, and only the backlog job needs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from blobstore_server.spark.session import kafka_source_jars


def test_a_missing_kafka_source_names_make_setup_and_fetches_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOBSTORE_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `make setup`"):
        kafka_source_jars()
    assert list(tmp_path.iterdir()) == []
