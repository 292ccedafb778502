from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_runtime import assignment, exits, ownership, settings


@given(st.integers(1, 256), st.integers(1, 64))
def test_owned_partitions_split_every_partition_exactly_once(
    partitions: int, replicas: int
) -> None:
    owned = [ownership.owned_partitions(partitions, k, replicas) for k in range(replicas)]
    flat = sorted(p for share in owned for p in share)
    assert flat == list(range(partitions))


def test_ordinal_from_statefulset_hostname() -> None:
    data = settings.DataSettings(replicas=3)
    assert ownership.resolve_ordinal(data, hostname="relay-queue-writer-2") == 2
    # Above n is no longer refused: the assignment decides what it owns (nothing, here).
    assert ownership.resolve_ordinal(data, hostname="relay-queue-writer-3") == 3
    with pytest.raises(exits.StartupError, match="ORDINAL"):
        ownership.resolve_ordinal(data, hostname="laptop")
    assert ownership.resolve_ordinal(settings.DataSettings(), hostname="laptop") == 0


def _v1(data_dir: Path, service: str, ordinal: int, replicas: int) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    record = {"v": 1, "service": service, "ordinal": ordinal, "replicas": replicas}
    (data_dir / "ownership.json").write_text(json.dumps(record) + "\n")


def test_a_version_1_data_dir_migrates_to_generation_1_of_its_recorded_split(
    tmp_path: Path,
) -> None:
    _v1(tmp_path, "queue-writer", 1, 2)
    found = ownership.claim_data_dir(tmp_path, "queue-writer", 1, 8)
    assert found == assignment.Assignment(1, 2, (0, 1, 0, 1, 0, 1, 0, 1))
    assert found is not None
    assert found.owned(1) == [1, 3, 5, 7]
    rewritten = json.loads((tmp_path / "ownership.json").read_text())
    assert rewritten == {
        "v": 2,
        "service": "queue-writer",
        "ordinal": 1,
        "generation": 1,
        "partitions": 8,
        "replicas": 2,
        "assignment": [0, 1, 0, 1, 0, 1, 0, 1],
    }
    assert not (tmp_path / "ownership.tmp").exists()
    # Read again (now version 2): the same assignment, whatever RELAY_DATA__REPLICAS says.
    assert ownership.claim_data_dir(tmp_path, "queue-writer", 1, 8) == found


def test_a_data_dir_records_the_newest_accepted_assignment(tmp_path: Path) -> None:
    assert ownership.claim_data_dir(tmp_path / "r", "retainer", 0, 4) is None
    newer = assignment.Assignment(3, 3, (2, 0, 1, 0))
    ownership.write(tmp_path / "r", "retainer", 0, newer)
    assert ownership.claim_data_dir(tmp_path / "r", "retainer", 0, 4) == newer


def test_a_data_dir_of_another_ordinal_or_service_is_refused(tmp_path: Path) -> None:
    _v1(tmp_path, "queue-writer", 0, 2)
    with pytest.raises(exits.StartupError, match="belongs to queue-writer instance 0") as caught:
        ownership.claim_data_dir(tmp_path, "queue-writer", 1, 8)
    assert caught.value.exit_code == exits.EXIT_CONFIG
    with pytest.raises(exits.StartupError, match="refusing to start as retainer"):
        ownership.claim_data_dir(tmp_path, "retainer", 0, 8)
    assert json.loads((tmp_path / "ownership.json").read_text())["v"] == 1  # unchanged


def test_corrupt_ownership_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ownership.json").write_text("{not json")
    with pytest.raises(exits.StartupError, match="corrupt"):
        ownership.claim_data_dir(tmp_path, "retainer", 0, 1)
    record = {"v": 2, "service": "retainer", "ordinal": 0, "generation": 1, "replicas": 1}
    (tmp_path / "ownership.json").write_text(json.dumps({**record, "assignment": [0, 0]}))
    with pytest.raises(exits.StartupError, match="not for 3 partitions"):
        ownership.claim_data_dir(tmp_path, "retainer", 0, 3)
