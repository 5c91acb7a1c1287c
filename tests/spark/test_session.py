"""Jobs never download: Spark's Kafka source (only the backlog job needs it) and S3A connector come from
`make setup`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from blobstore_server.spark.session import kafka_source_jars, s3a_jars


@pytest.mark.parametrize("jars", [kafka_source_jars, s3a_jars])
def test_missing_jars_name_make_setup_and_fetch_nothing(jars: Callable[[], list[Path]], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOBSTORE_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="run `make setup`"):
        jars()
    assert list(tmp_path.iterdir()) == []
