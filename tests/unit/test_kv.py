from pathlib import Path

import pytest

from blobstore_server.libs.kv import KVError, KVStore


def test_column_families_are_separate_and_persist(tmp_path: Path) -> None:
    with KVStore(tmp_path / "db", ["a", "b"]) as kv:
        kv.put("a", b"k", b"1")
        kv.put("b", b"k", b"2")
    with KVStore(tmp_path / "db") as kv:
        assert kv.column_families == ["a", "b", "default"]
        assert kv.get("a", b"k") == b"1"
        assert kv.get("b", b"k") == b"2"
        assert kv.get("default", b"k") is None


def test_batch_is_atomic_across_families(tmp_path: Path) -> None:
    with KVStore(tmp_path / "db", ["a", "b"]) as kv:
        kv.put("a", b"old", b"x")
        batch = kv.batch()
        batch.put("a", b"new", b"1")
        batch.delete("a", b"old")
        batch.put("b", b"new", b"2")
        assert kv.get("a", b"new") is None
        kv.write(batch)
        assert kv.get("a", b"old") is None
        assert (kv.get("a", b"new"), kv.get("b", b"new")) == (b"1", b"2")


def test_a_batchs_written_actions_run_after_its_write_and_never_for_a_dropped_batch(tmp_path: Path) -> None:
    seen: list[bytes | None] = []
    with KVStore(tmp_path / "db", ["a"]) as kv:
        dropped, written = kv.batch(), kv.batch()
        dropped.put("a", b"k", b"0")
        dropped.on_written(lambda: seen.append(b"dropped"))
        written.put("a", b"k", b"1")
        written.on_written(lambda: seen.append(kv.get("a", b"k")))
        assert seen == []
        kv.write(written)
    assert seen == [b"1"]


def test_range_and_prefix_iteration_in_key_order(tmp_path: Path) -> None:
    with KVStore(tmp_path / "db", ["a"]) as kv:
        for key in (b"p2", b"p1", b"q1", b"o9"):
            kv.put("a", key, key)
        assert [k for k, _ in kv.items("a", b"p", b"q")] == [b"p1", b"p2"]
        assert [k for k, _ in kv.prefix_items("a", b"p")] == [b"p1", b"p2"]
        assert [k for k, _ in kv.items("a")] == [b"o9", b"p1", b"p2", b"q1"]


def test_checkpoint_is_a_consistent_copy(tmp_path: Path) -> None:
    with KVStore(tmp_path / "db", ["a"]) as kv:
        kv.put("a", b"k", b"before")
        kv.checkpoint(tmp_path / "cp")
        kv.put("a", b"k", b"after")
    with KVStore(tmp_path / "cp") as copy:
        assert copy.get("a", b"k") == b"before"


def test_unknown_family_and_closed_store_raise(tmp_path: Path) -> None:
    kv = KVStore(tmp_path / "db", ["a"])
    with pytest.raises(KVError, match="unknown column family"):
        kv.get("nope", b"k")
    kv.close()
    with pytest.raises(KVError, match="closed"):
        kv.get("a", b"k")


def test_every_column_family_has_a_bloom_filter(tmp_path: Path) -> None:
    """A blobnode looks new bids up from its event loop: absent keys must not need a data block read."""
    with KVStore(tmp_path / "db", ["a", "b"]):
        pass
    with KVStore(tmp_path / "db"):
        pass  # reopened: the options hold for the families found on disk too
    newest = max(tmp_path.glob("db/OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    sections = newest.read_text().split("[TableOptions/BlockBasedTable")[1:]
    assert len(sections) == 3 and all("filter_policy=bloomfilter" in s for s in sections)
