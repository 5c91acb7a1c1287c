import pytest
from pydantic import BaseModel, ValidationError

from blobstore_server.libs.ec import ALIGN_2KB, CodeMode, CodeModeName, UnknownCodeMode, parse_code_mode, tactic

# (N, M, L, AZ count, put quorum) exactly as CubeFS BlobStore's constCodeModeTactic.
SEED_TABLE = {
    "EC15P12": (15, 12, 0, 3, 24),
    "EC6P6": (6, 6, 0, 3, 11),
    "EC16P20L2": (16, 20, 2, 2, 34),
    "EC6P10L2": (6, 10, 2, 2, 14),
    "EC12P4": (12, 4, 0, 1, 15),
    "EC16P4": (16, 4, 0, 1, 19),
    "EC3P3": (3, 3, 0, 1, 5),
    "EC10P4": (10, 4, 0, 1, 13),
    "EC6P3": (6, 3, 0, 1, 8),
    "EC6P3L3": (6, 3, 3, 3, 9),
    "EC4P4L2": (4, 4, 2, 2, 6),
}


@pytest.mark.parametrize("name", sorted(SEED_TABLE))
def test_table_matches_seed(name: str) -> None:
    t = tactic(CodeMode[name])
    assert (t.n, t.m, t.l, t.az_count, t.put_quorum) == SEED_TABLE[name]
    assert t.min_shard_size == ALIGN_2KB == 2048
    assert t.total == t.n + t.m + t.l


def test_every_mode_has_a_tactic_and_numbers_are_stable() -> None:
    assert {m.name for m in CodeMode} == set(SEED_TABLE)
    # On the wire and on disk: never renumber.
    assert {m.name: m.value for m in CodeMode} == {
        "EC15P12": 1, "EC6P6": 2, "EC16P20L2": 3, "EC6P10L2": 4, "EC6P3L3": 5, "EC4P4L2": 8,
        "EC12P4": 9, "EC16P4": 10, "EC3P3": 11, "EC10P4": 12, "EC6P3": 13,
    }


def test_parse_by_name_number_and_enum() -> None:
    assert parse_code_mode("EC6P3") is CodeMode.EC6P3
    assert parse_code_mode("ec6p10l2") is CodeMode.EC6P10L2
    assert parse_code_mode(13) is CodeMode.EC6P3
    assert parse_code_mode("13") is CodeMode.EC6P3
    assert parse_code_mode(CodeMode.EC3P3) is CodeMode.EC3P3


@pytest.mark.parametrize("bad", ["EC7P3", "", "6P3", 0, 99, "99", -1, True, None, 13.0])
def test_unknown_mode_is_typed_and_clear(bad: object) -> None:
    with pytest.raises(UnknownCodeMode, match="unknown code mode") as info:
        parse_code_mode(bad)
    assert "EC6P3" in str(info.value)
    assert isinstance(info.value, ValueError)


class Fields(BaseModel):
    number: CodeMode
    name: CodeModeName
    names: list[CodeModeName] = []


def test_a_field_reads_name_or_number_and_writes_what_the_wire_always_carried() -> None:
    read = Fields.model_validate_json('{"number": "ec3p3", "name": 13, "names": ["EC6P6", "11"]}')
    assert (read.number, read.name, read.names) == (CodeMode.EC3P3, CodeMode.EC6P3, [CodeMode.EC6P6, CodeMode.EC3P3])
    assert read.model_dump_json() == '{"number":11,"name":"EC6P3","names":["EC6P6","EC3P3"]}'
    assert read.model_dump()["name"] is CodeMode.EC6P3
    assert Fields.model_validate_json(read.model_dump_json()) == read


@pytest.mark.parametrize("bad", ['"EC7P3"', "99", "true", "null"])
def test_a_field_refuses_what_is_no_mode(bad: str) -> None:
    with pytest.raises(ValidationError, match="unknown code mode"):
        Fields.model_validate_json(f'{{"number": {bad}, "name": "EC3P3"}}')


def test_shard_size() -> None:
    t = tactic(CodeMode.EC6P3)
    assert t.shard_size(0) == 2048
    assert t.shard_size(1) == 2048
    assert t.shard_size(6 * 2048) == 2048
    assert t.shard_size(6 * 2048 + 1) == 2049
    assert t.shard_size(4 * 1024 * 1024) == 699051


def test_lrc_local_stripes_follow_seed_layout() -> None:
    assert tactic(CodeMode.EC6P10L2).local_stripes() == (
        (0, 1, 2, 6, 7, 8, 9, 10, 16),
        (3, 4, 5, 11, 12, 13, 14, 15, 17),
    )
    assert tactic(CodeMode.EC4P4L2).local_stripes() == ((0, 1, 4, 5, 8), (2, 3, 6, 7, 9))
    assert tactic(CodeMode.EC6P3L3).local_stripes() == ((0, 1, 6, 9), (2, 3, 7, 10), (4, 5, 8, 11))
    stripes = tactic(CodeMode.EC16P20L2).local_stripes()
    assert [len(s) for s in stripes] == [19, 19]
    assert sorted(i for s in stripes for i in s) == list(range(38))
    assert tactic(CodeMode.EC6P3).local_stripes() == ()
    assert tactic(CodeMode.EC6P10L2).local_stripe_of(12) == (3, 4, 5, 11, 12, 13, 14, 15, 17)
    assert tactic(CodeMode.EC6P3).local_stripe_of(0) == ()
