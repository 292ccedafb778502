from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_runtime import exits, ownership, settings


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
    with pytest.raises(exits.StartupError, match="out of range"):
        ownership.resolve_ordinal(data, hostname="relay-queue-writer-3")
    with pytest.raises(exits.StartupError, match="ORDINAL"):
        ownership.resolve_ordinal(data, hostname="laptop")
    assert ownership.resolve_ordinal(settings.DataSettings(), hostname="laptop") == 0


def test_data_dir_refuses_a_different_number_of_instances(tmp_path: Path) -> None:
    ownership.claim_data_dir(tmp_path / "qw", "queue-writer", 0, 2)
    ownership.claim_data_dir(tmp_path / "qw", "queue-writer", 0, 2)  # same split: fine
    with pytest.raises(exits.StartupError, match="instance 0 of 2; refusing") as caught:
        ownership.claim_data_dir(tmp_path / "qw", "queue-writer", 0, 3)
    assert caught.value.exit_code == exits.EXIT_CONFIG


def test_corrupt_ownership_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ownership.json").write_text("{not json")
    with pytest.raises(exits.StartupError, match="corrupt"):
        ownership.claim_data_dir(tmp_path, "retainer", 0, 1)
