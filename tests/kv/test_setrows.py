"""A set stored as rows (`relay_kv.setrows`) shows what the whole-set `AWSet` shows, for any
history of adds, removes and merges on three replicas, from an empty set or from a set written
whole before rows existed (a legacy head)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from relay_kv import ops, placement, setrows
from relay_kv.clock import Version
from relay_kv.crdt import AWSet
from tests.kv.strategies import MEMBERS, SITES

NOW = 0


@dataclass
class Rows:
    """One replica's set as rows: the head and each member's row."""

    head: AWSet | None = None
    rows: dict[bytes, AWSet] = field(default_factory=dict)

    def change(self, add: list[bytes], remove: list[bytes], version: Version) -> None:
        head, written = setrows.change(
            self.head, {m: self.rows.get(m) for m in add + remove}, add, remove, version, None
        )
        self.head = head
        self.rows.update(written)

    def merge(self, other: Rows) -> None:
        if other.head is not None:
            self.head = other.head if self.head is None else self.head.merge(other.head)
        for member, row in other.rows.items():
            mine = self.rows.get(member)
            self.rows[member] = row if mine is None else mine.merge(row)

    def members(self) -> list[bytes]:
        return setrows.members(self.head, sorted(self.rows.items()), NOW)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[AWSet], list[Rows]]:
    """Three replicas (one per site) of one set, kept both ways; the first `legacy` operations
    build whole sets only, which then become the heads of the row replicas."""
    whole = [AWSet() for _ in SITES]
    rows: list[Rows] | None = None
    legacy = draw(st.integers(0, 12))
    wall = 0
    for step in range(draw(st.integers(0, 30))):
        if step == legacy:
            rows = [Rows(head=w if w.clock else None) for w in whole]
        at = draw(st.integers(0, len(SITES) - 1))
        wall += draw(st.integers(1, 2))
        version = Version(wall, draw(st.integers(0, 5)), SITES[at])
        op = draw(st.sampled_from(("change", "change", "merge")))
        if op == "change":
            add = draw(st.lists(st.sampled_from(MEMBERS), max_size=2, unique=True))
            remove = draw(st.lists(st.sampled_from(MEMBERS), max_size=2, unique=True))
            whole[at] = ops.change_members(whole[at], add, remove, version, None)
            if rows is not None:
                rows[at].change(add, remove, version)
        else:
            source = draw(st.integers(0, len(SITES) - 1))
            whole[at] = whole[at].merge(whole[source])
            if rows is not None:
                rows[at].merge(rows[source])
    if rows is None:
        rows = [Rows(head=w if w.clock else None) for w in whole]
    return whole, rows


@settings(max_examples=400, deadline=None)
@given(histories())
def test_rows_show_what_the_whole_set_shows(history: tuple[list[AWSet], list[Rows]]) -> None:
    whole, rows = history
    for w, r in zip(whole, rows, strict=True):
        assert r.members() == w.members(NOW)
    everything = Rows()
    merged = AWSet()
    for w, r in zip(whole, rows, strict=True):
        everything.merge(r)
        merged = merged.merge(w)
    assert everything.members() == merged.members(NOW)


def test_a_touched_legacy_member_moves_from_the_head_into_its_row() -> None:
    v1, v2, v3 = (Version(t, 0, SITES[0]) for t in (1, 2, 3))
    legacy = AWSet().add([b"x", b"y"], v1)
    head, written = setrows.change(legacy, {b"x": None}, [], [b"x"], v2, None)
    assert list(head.entries) == [b"y"]
    assert head.clock == legacy.clock
    assert setrows.members(head, written.items(), NOW) == [b"y"]
    # A replica still holding the older head: the row's clock covers the member's old dot.
    assert setrows.members(legacy, written.items(), NOW) == [b"y"]
    assert setrows.members(legacy.merge(head), [], NOW) == [b"y"]
    head, written = setrows.change(head, {b"x": written[b"x"]}, [b"x"], [], v3, None)
    assert setrows.members(head, written.items(), NOW) == [b"x", b"y"]


def test_rows_sort_in_member_order_and_live_in_the_key_shard() -> None:
    members = [b"", b"\x00", b"\x01", b"a", b"ab", b"b", b"\xff"]
    keys = [setrows.row_key("set", m) for m in members]
    assert sorted(keys, key=str.encode) == keys
    assert [setrows.member_of(k) for k in keys] == members
    assert all(k.startswith(setrows.row_prefix("set")) for k in keys)
    assert not setrows.row_key("se", b"t").startswith(setrows.row_prefix("set"))
    assert {placement.shard_of("ns", k) for k in keys} == {placement.shard_of("ns", "set")}
