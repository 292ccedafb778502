"""The client operations on values: paging walks every item once, a set change is add-wins, a
delete removes what was observed, and type changes of live values are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_kv import ops
from relay_kv.clock import Version
from relay_kv.crdt import AWSet, KvMap, Register

A = "A" * 16


@given(st.lists(st.binary(max_size=3), unique=True).map(sorted), st.integers(1, 5))
def test_pages_walk_every_item_once_in_order(items: list[bytes], limit: int) -> None:
    seen: list[bytes] = []
    cursor = None
    for _ in range(len(items) + 2):
        page, cursor = ops.page(items, bytes, cursor, limit)
        assert len(page) <= limit
        seen += page
        if cursor is None:
            break
    assert seen == items


def test_a_member_both_added_and_removed_is_present() -> None:
    start = AWSet().add([b"m"], Version(1, 0, A))
    changed = ops.change_members(start, [b"m", b"n"], [b"m"], Version(2, 0, A), None)
    assert changed.members(0) == [b"m", b"n"]
    assert ops.change_members(None, [], [b"x"], Version(3, 0, A), None).members(0) == []


def test_a_delete_removes_what_was_observed() -> None:
    version = Version(9, 0, A)
    s = AWSet().add([b"a", b"b"], Version(1, 0, A))
    assert ops.delete(s, version, 0).members(0) == []  # type: ignore[union-attr]
    m = KvMap({"f": Register(Version(1, 0, A), b"1")})
    deleted = ops.delete(m, version, 0)
    assert isinstance(deleted, KvMap)
    assert deleted.merge(m).visible(0) == {}
    assert ops.delete(None, version, 0) == Register(version, None)


def test_live_values_keep_their_type() -> None:
    live_set = AWSet().add([b"a"], Version(1, 0, A))
    with pytest.raises(ops.WrongType, match="set"):
        ops.check_type(live_set, Register, 0)
    dead_string = Register(Version(1, 0, A), None)
    ops.check_type(dead_string, AWSet, 0)  # a deleted string may become a set
    dead_map = KvMap({"f": Register(Version(1, 0, A), None)})
    with pytest.raises(ops.WrongType, match="map"):
        ops.check_type(dead_map, AWSet, 0)  # a map tombstone would still win the merge
    assert ops.versions(dead_map) == [Version(1, 0, A)]
