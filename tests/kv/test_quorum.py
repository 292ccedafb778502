"""Quorum rounds: OK after W acknowledgements, INDETERMINATE once W cannot be reached,
UNAVAILABLE (nothing sent) when fewer than W replicas are reachable; reads merge and name the
stale replicas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_kv import quorum
from relay_kv.clock import Version
from relay_kv.crdt import Register
from relay_kv.placement import Replicas

HOME = ("a", "b", "c")
REPLICAS = Replicas(HOME, ("d", "e"))


@given(st.integers(1, 3), st.lists(st.tuples(st.sampled_from(HOME), st.booleans())))
def test_a_write_round_is_decided_by_its_acks(w: int, events: list[tuple[str, bool]]) -> None:
    round_ = quorum.WriteRound(HOME, w)
    decided = None
    for site, ok in events:
        if ok:
            round_.ack(site)
        else:
            round_.fail(site)
        if decided is not None:
            assert round_.decided == decided  # never changes once decided
        decided = round_.decided
    acks = len(round_.acked)
    if acks >= w:
        assert round_.final() is quorum.Outcome.OK
    else:
        assert round_.final() is quorum.Outcome.INDETERMINATE


def test_unreachable_replicas_get_hints_on_the_first_reachable_fallback() -> None:
    plan = quorum.plan_write(REPLICAS, {"a", "c", "e"}, 2)
    assert plan.targets == ("a", "c")
    assert plan.hints == {"b": "e"}
    with pytest.raises(quorum.Unavailable):
        quorum.plan_write(REPLICAS, {"a", "d"}, 2)


def test_a_read_merges_and_names_stale_replicas() -> None:
    old = Register(Version(1, 0, "A" * 16), b"old")
    new = Register(Version(2, 0, "B" * 16), b"new")
    round_ = quorum.ReadRound(HOME, 2)
    round_.answer("a", old)
    assert round_.decided is None
    round_.answer("b", new)
    assert round_.decided is quorum.Outcome.OK
    assert round_.merged() == new
    assert round_.stale() == ["a"]
    round_.fail("c")
    assert round_.decided is quorum.Outcome.OK
    short = quorum.ReadRound(HOME, 3)
    short.fail("a")
    assert short.decided is quorum.Outcome.UNAVAILABLE
