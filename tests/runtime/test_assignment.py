"""The assignment rules (`relay_runtime.assignment`), and the fencing protocol they serve run
as a model: any interleaving of installs, publications and reads never gives a partition two
serving instances."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_runtime import assignment
from relay_runtime.assignment import Assignment, Verdict


def test_validation_names_what_is_wrong() -> None:
    cases = {
        "BAD_GENERATION": Assignment(0, 2, (0, 1)),
        "BAD_REPLICAS": Assignment(1, 0, (0,)),
        "BAD_PARTITIONS": Assignment(1, 1, ()),
        "BAD_OWNER": Assignment(1, 2, (0, 2)),
    }
    for code, bad in cases.items():
        with pytest.raises(assignment.InvalidAssignment) as caught:
            assignment.validate(bad)
        assert caught.value.code == code
    with pytest.raises(assignment.InvalidAssignment) as caught:
        assignment.validate(Assignment(1, 2, (0, 1)), partitions=3)
    assert caught.value.code == "PARTITIONS_MISMATCH"
    assert assignment.validate(Assignment(1, 2, (1, 1))).owned(0) == []


def test_parse_refuses_malformed_records() -> None:
    good = {"generation": 2, "partitions": 3, "replicas": 2, "assignment": [1, 0, 1]}
    assert assignment.parse(good) == Assignment(2, 2, (1, 0, 1))
    for bad in (
        {"generation": 2, "replicas": 2},
        {**good, "generation": "2"},
        {**good, "generation": True},
        {**good, "assignment": [1, 0, None]},
        {**good, "partitions": 4},
        [1, 2],
    ):
        with pytest.raises(assignment.InvalidAssignment) as caught:
            assignment.parse(bad)  # type: ignore[arg-type]
        assert caught.value.code == "BAD_ASSIGNMENT"


def test_compare_and_newest() -> None:
    g2 = Assignment(2, 2, (0, 1))
    assert assignment.compare(None, g2) is Verdict.NEWER
    assert assignment.compare(g2, Assignment(3, 1, (0, 0))) is Verdict.NEWER
    assert assignment.compare(g2, Assignment(1, 2, (0, 1))) is Verdict.STALE
    assert assignment.compare(g2, Assignment(2, 2, (0, 1))) is Verdict.SAME
    assert assignment.compare(g2, Assignment(2, 2, (1, 0))) is Verdict.CONFLICT
    assert assignment.newest(None, Assignment(1, 1, (0, 0)), g2, None) == g2
    assert assignment.newest(None, None) is None
    with pytest.raises(assignment.InvalidAssignment) as caught:
        assignment.newest(g2, Assignment(2, 2, (1, 0)))
    assert caught.value.code == "CONFLICT"


def test_from_v1_is_generation_1_of_p_mod_n() -> None:
    assert assignment.from_v1({"v": 1, "ordinal": 0, "replicas": 3}, 5) == Assignment(
        1, 3, (0, 1, 2, 0, 1)
    )
    with pytest.raises(assignment.InvalidAssignment):
        assignment.from_v1({"v": 1, "ordinal": 0}, 5)


def test_serving_waits_for_the_previous_owner_to_publish() -> None:
    g1 = assignment.initial(4, 2)  # 0: [0, 2], 1: [1, 3]
    g2 = Assignment(2, 2, (0, 0, 0, 1))  # partition 1 moves to 0
    # 1 has not accepted g2 yet: 0 keeps what it had, partition 1 waits.
    assert assignment.serving(0, g2, {0: g2, 1: g1}) == [0, 2]
    assert assignment.serving(0, g2, {0: g2, 1: g2}) == [0, 1, 2]
    # 0 published g2 (it may serve 1 already): 1, still on g1, leaves partition 1 alone.
    assert assignment.serving(1, g1, {0: g2, 1: g1}) == [3]
    # Same generation, other owners (an operator bug): everything the other claims waits.
    rogue = Assignment(2, 2, (1, 1, 1, 1))
    assert assignment.serving(0, g2, {0: g2, 1: rogue}) == []
    # Nothing published by the others: a fresh pool.
    assert assignment.serving(1, g1, {}) == [1, 3]


# The model: instances install offered assignments in two steps, as `relay_bus.fencing` does:
# (1) stop serving what the new one removes, record it, publish it; (2) read every instance's
# last publication and serve what `assignment.serving` allows. Any interleaving is checked.

PARTITIONS = 4
ORDINALS = 3


@dataclass
class Instance:
    accepted: Assignment | None = None
    serving: set[int] = field(default_factory=set)
    published_pending_read: bool = False


def _assignments() -> st.SearchStrategy[Assignment]:
    return st.builds(
        lambda g, owners: Assignment(g, ORDINALS, tuple(owners)),
        st.integers(1, 6),
        st.lists(st.integers(0, ORDINALS - 1), min_size=PARTITIONS, max_size=PARTITIONS),
    )


_steps = st.lists(
    st.one_of(
        st.tuples(st.just("install"), st.integers(0, ORDINALS - 1), _assignments()),
        st.tuples(st.just("read"), st.integers(0, ORDINALS - 1), st.none()),
        st.tuples(st.just("restart"), st.integers(0, ORDINALS - 1), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(_steps)
def test_no_interleaving_of_installs_gives_a_partition_two_servers(
    steps: list[tuple[str, int, Assignment | None]],
) -> None:
    pool = [Instance() for _ in range(ORDINALS)]
    log: dict[int, Assignment] = {}
    for action, k, offered in steps:
        me = pool[k]
        if action == "restart":
            # The process dies (serves nothing) and starts on what its data dir recorded and
            # what the others published: the newest, if they agree.
            me.serving = set()
            me.published_pending_read = False
            try:
                decided = assignment.newest(me.accepted, *log.values())
            except assignment.InvalidAssignment:
                continue  # refused to start
            if decided is None:
                continue
            me.accepted = decided
            log[k] = decided
            me.published_pending_read = True
        elif action == "install":
            assert offered is not None
            verdict = assignment.compare(me.accepted, offered)
            if verdict in (Verdict.STALE, Verdict.CONFLICT):
                assert me.accepted is not None
                assert offered.generation <= me.accepted.generation
                assert offered != me.accepted
                continue  # refused: nothing changes
            me.serving &= set(offered.owned(k))
            me.accepted = offered
            log[k] = offered
            me.published_pending_read = True
        elif me.accepted is not None and me.published_pending_read:
            me.serving = set(assignment.serving(k, me.accepted, log))
            me.published_pending_read = False
        for inst_k, inst in enumerate(pool):
            if inst.accepted is not None:
                assert inst.serving <= set(inst.accepted.owned(inst_k))
        for p in range(PARTITIONS):
            servers = [i for i, inst in enumerate(pool) if p in inst.serving]
            assert len(servers) <= 1, f"partition {p} served by {servers}"


@given(st.lists(_assignments(), max_size=20))
def test_an_instance_only_ever_moves_to_newer_generations(offers: list[Assignment]) -> None:
    current: Assignment | None = None
    for offered in offers:
        verdict = assignment.compare(current, offered)
        if verdict is Verdict.NEWER:
            assert current is None or offered.generation > current.generation
            current = offered
        elif verdict is Verdict.SAME:
            assert offered == current
        else:
            assert current is not None
            assert offered != current
            assert offered.generation <= current.generation


def test_partitions_gained_while_down_are_withheld_until_an_install() -> None:
    # The hand-off's target restarted after the source's pause: its record says generation 1
    # (partition 2 on ordinal 0), the source's publication generation 2 (partition 2 on 1).
    recorded = Assignment(1, 2, (0, 0, 0, 0))
    published = Assignment(2, 2, (0, 0, 1, 0))
    assert assignment.gained_while_down(1, recorded, published) == [2]
    assert assignment.gained_while_down(0, recorded, published) == []  # it loses, gains none
    # No record (a new or emptied volume), or nothing newer: nothing withheld.
    assert assignment.gained_while_down(1, None, published) == []
    assert assignment.gained_while_down(1, published, published) == []
    # What its own record gave it already is not "gained".
    kept = Assignment(3, 2, (0, 0, 1, 1))
    assert assignment.gained_while_down(1, published, kept) == [3]
