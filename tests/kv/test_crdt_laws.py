"""The merge laws every replicated value keeps (commutative, associative, idempotent), add-wins
for sets, and the encoding's round trip. These are what lets replicas exchange whole values in
any order, any number of times, and still agree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay_kv import codec
from relay_kv.clock import Version
from relay_kv.crdt import AWSet, KvMap, Register, Value, merge
from tests.kv import strategies as kvst
from tests.kv.strategies import SITES, SetHistory

LAWS = settings(max_examples=300, deadline=None)


@LAWS
@given(kvst.values, kvst.values)
def test_merge_is_commutative(a: Value, b: Value) -> None:
    assert merge(a, b) == merge(b, a)
    assert codec.encode(merge(a, b)) == codec.encode(merge(b, a))


@LAWS
@given(kvst.values, kvst.values, kvst.values)
def test_merge_is_associative(a: Value, b: Value, c: Value) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))


@LAWS
@given(kvst.values)
def test_merge_is_idempotent(a: Value) -> None:
    assert merge(a, a) == a


@LAWS
@given(kvst.values, kvst.values)
def test_merge_absorbs(a: Value, b: Value) -> None:
    """Merging what was already merged in changes nothing (a replica that receives the same
    state again, or an older one, stays as it is)."""
    ab = merge(a, b)
    assert merge(ab, a) == ab
    assert merge(ab, b) == ab


@LAWS
@given(kvst.set_histories())
def test_sets_keep_every_add_no_remove_observed(history: SetHistory) -> None:
    """Once every replica's state is merged, the members are exactly the adds not observed by
    any remove: no acknowledged add lost, no member never written, a removed add stays removed."""
    merged = kvst.merge_all(history.replicas)
    assert set(merged.members(0)) == history.expected()


@LAWS
@given(kvst.set_histories(), st.permutations(range(3)))
def test_sets_converge_in_any_order(history: SetHistory, order: list[int]) -> None:
    in_order = kvst.merge_all(history.replicas)
    shuffled = kvst.merge_all([history.replicas[i] for i in order])
    assert in_order == shuffled


def test_concurrent_add_and_remove_add_wins() -> None:
    a, b = SITES[0], SITES[1]
    start = AWSet().add([b"m"], Version(1, 0, a))
    at_a = start.add([b"m"], Version(5, 0, a))  # re-added at a...
    at_b = start.remove([b"m"], Version(6, 0, b))  # ...while b removes what it saw
    assert merge(at_a, at_b).members(0) == [b"m"]  # type: ignore[union-attr]
    assert merge(at_b, at_a).members(0) == [b"m"]  # type: ignore[union-attr]


def test_a_remove_after_the_add_was_seen_stays() -> None:
    a, b = SITES[0], SITES[1]
    added = AWSet().add([b"m"], Version(1, 0, a))
    removed = added.remove([b"m"], Version(2, 0, b))
    assert merge(added, removed).members(0) == []  # type: ignore[union-attr]


def test_a_later_write_wins_and_ties_break_by_site() -> None:
    early = Register(Version(10, 0, SITES[2]), b"old")
    late = Register(Version(11, 0, SITES[0]), b"new")
    assert merge(early, late) == late
    tie_a = Register(Version(11, 0, SITES[0]), b"a")
    tie_b = Register(Version(11, 0, SITES[1]), b"b")
    assert merge(tie_a, tie_b) == tie_b == merge(tie_b, tie_a)


def test_types_merge_by_rank() -> None:
    register = Register(Version(99, 0, SITES[0]), b"v")
    a_set = AWSet().add([b"m"], Version(1, 0, SITES[0]))
    a_map = KvMap({"f": Register(Version(1, 0, SITES[1]), b"1")})
    assert merge(register, a_set) == a_set
    assert merge(a_map, a_set) == a_map


@LAWS
@given(kvst.values)
def test_encoding_round_trips(value: Value) -> None:
    assert codec.decode(codec.encode(value)) == value


def test_expired_members_and_registers_read_as_absent() -> None:
    s = AWSet().add([b"m"], Version(1, 0, SITES[0]), expires_at=100)
    assert s.members(99) == [b"m"]
    assert s.members(100) == []
    r = Register(Version(1, 0, SITES[0]), b"v", expires_at=100)
    assert r.visible(99) == b"v"
    assert r.visible(100) is None
