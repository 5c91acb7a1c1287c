"""Task switches: the config key scheme, parsing, and waiting while a switch is off (no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from blobstore_server.libs.proto.scheduler import TaskRecord, TaskState, task_key
from blobstore_server.libs.proto.switches import Switches, TaskType, parse_switch, switch_key, switch_states
from blobstore_server.spark.deep import Pacer


def test_every_cubefs_task_type_has_a_switch_key() -> None:
    assert [switch_key(t) for t in TaskType] == [
        "switch/disk_repair", "switch/disk_drop", "switch/balance", "switch/manual_migrate",
        "switch/volume_inspect", "switch/shard_repair", "switch/blob_delete"]


def test_parse_switch_accepts_on_and_off_only() -> None:
    assert parse_switch("switch/shard_repair", "off") == (TaskType.SHARD_REPAIR, False)
    assert parse_switch("switch/balance", "on") == (TaskType.BALANCE, True)
    with pytest.raises(ValueError, match="must be 'on' or 'off'"):
        parse_switch("switch/balance", "yes")
    with pytest.raises(ValueError, match="no task type 'scrub'"):
        parse_switch("switch/scrub", "on")


def test_unset_and_malformed_switches_count_as_on() -> None:
    states = switch_states({"switch/blob_delete": "off", "switch/balance": "bogus", "switch/nope": "off",
                            "code_mode_policy": "[]"})
    assert states == {**dict.fromkeys(TaskType, True), TaskType.BLOB_DELETE: False}


def test_work_waits_while_its_switch_is_off_and_resumes_when_on() -> None:
    async def scenario() -> list[str]:
        switches, seen = Switches(), []
        switches.update({TaskType.SHARD_REPAIR: False})

        async def repair() -> None:
            await switches.wait_on(TaskType.SHARD_REPAIR)
            seen.append("repaired")

        task = asyncio.create_task(repair())
        await asyncio.sleep(0.05)
        seen.append("still waiting" if not task.done() else "ran while off")
        assert switches.is_on(TaskType.BLOB_DELETE)  # the others are untouched
        switches.update(switch_states({}))
        await asyncio.wait_for(task, 1)
        return seen

    assert asyncio.run(scenario()) == ["still waiting", "repaired"]


def test_follow_keeps_the_last_states_when_clustermgr_cannot_be_read() -> None:
    async def scenario() -> bool:
        switches, answers = Switches(), [{"switch/shard_repair": "off"}]

        async def read() -> dict[str, str]:
            if answers:
                return answers.pop()
            raise ConnectionError("clustermgr down")

        follower = asyncio.create_task(switches.follow(read, 0.01))
        await asyncio.sleep(0.1)
        follower.cancel()
        return switches.is_on(TaskType.SHARD_REPAIR)

    assert asyncio.run(scenario()) is False


def test_task_records_are_keyed_by_type_and_id_and_open_until_final() -> None:
    record = TaskRecord(task_id="t1", task_type=TaskType.DISK_REPAIR, disk_id=3, vid=7, unit_index=2,
                        source_vuid=7 << 32 | 2 << 24 | 1, ctime=1.0, mtime=2.0)
    assert record.key == task_key(TaskType.DISK_REPAIR, "t1") == "task/disk_repair/t1"
    assert record.open
    assert not record.model_copy(update={"state": TaskState.FINISHED_IN_ADVANCE}).open


def test_the_deep_read_pacer_holds_the_rate() -> None:
    pacer = Pacer(rate=1000.0)
    assert pacer.delay(500, now=pacer.start) == pytest.approx(0.5)
    assert pacer.delay(500, now=pacer.start + 2.0) == 0.0  # behind schedule: no wait
