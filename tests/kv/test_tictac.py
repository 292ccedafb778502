"""Tictac hashes updated per write equal a recompute from the final keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relay_kv import placement, tictac

writes = st.lists(
    st.tuples(st.sampled_from(["k1", "k2", "k3", "k4", "k5"]), st.none() | st.binary(max_size=4))
)


@given(writes)
def test_incremental_hashes_equal_a_recompute(ops: list[tuple[str, bytes | None]]) -> None:
    stored: dict[str, bytes] = {}
    tree = tictac.Tree()
    for key, value in ops:
        shard = placement.shard_of("ns", key)
        old = tictac.key_hash("ns", key, stored.get(key))
        tree.update(shard, old, tictac.key_hash("ns", key, value))
        if value is None:
            stored.pop(key, None)
        else:
            stored[key] = value
    again = tictac.Tree.recompute(
        (placement.shard_of("ns", k), "ns", k, v) for k, v in stored.items()
    )
    assert tree.shards == again.shards
    shards = range(placement.SHARDS)
    assert tree.groups(shards) == again.groups(shards)


def test_a_changed_value_changes_its_shard_and_group() -> None:
    a = tictac.Tree.recompute([(7, "ns", "k", b"1")])
    b = tictac.Tree.recompute([(7, "ns", "k", b"2")])
    assert a.shard(7) != b.shard(7)
    assert a.groups([7]) != b.groups([7])
