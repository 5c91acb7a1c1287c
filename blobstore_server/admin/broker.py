"""deploy/kafka/broker.py, which fetches, starts and stops our Kafka brokers: deploy/ is no installed package,
so it is loaded from the source tree by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the checkout: blobstore/, blobstore_server/ and deploy/


def _load() -> ModuleType:
    path = SOURCE_ROOT / "deploy" / "kafka" / "broker.py"
    spec = importlib.util.spec_from_file_location("blobstore_kafka_broker", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


broker = _load()
