"""A membership change under way (`relay_kv.membership`): writes go to the old and the new home
replicas and count W in each, so an acknowledged write meets every read quorum of either set;
reads stay on the old set until every joining site pulled exactly the shards it enters, then
move; writes stop going to the old set only once every site reads the new one; a shard whose
home set does not move is planned as without a change."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_kv import membership, quorum
from relay_kv.placement import View

SITES = [f"{i:016x}" for i in range(1, 7)]
SAMPLE = range(0, 65_536, 64)


@st.composite
def changes(draw: st.DrawFn) -> membership.Change:
    old = draw(st.lists(st.sampled_from(SITES), unique=True, min_size=1, max_size=5))
    new = draw(st.lists(st.sampled_from(SITES), unique=True, min_size=1, max_size=6))
    if sorted(old) == sorted(new):
        new = [*new, next(s for s in SITES if s not in new)] if len(new) < 6 else new[1:]
    return membership.Change.start(View(3, tuple(sorted(old))), new, 4)


@settings(max_examples=60, deadline=None)
@given(changes(), st.integers(0, 65_535), st.integers(1, 3), st.data())
def test_an_acknowledged_write_meets_every_read_quorum_of_both_views(
    change: membership.Change, shard: int, n: int, data: st.DataObject
) -> None:
    joint = change.replicas(shard, n)
    reachable = set(data.draw(st.sets(st.sampled_from(SITES))))
    w = data.draw(st.integers(1, n))
    try:
        plan = membership.plan_write(joint, reachable, w)
    except quorum.Unavailable:
        old_up = [s for s in joint.old.home if s in reachable]
        new_up = [s for s in joint.new.home if s in reachable]
        assert len(old_up) < w or len(new_up) < w
        return
    assert set(plan.targets) == set(joint.home) & reachable
    assert not set(plan.hints) & reachable
    assert not set(plan.hints.values()) & set(plan.targets)
    round_ = membership.JointWriteRound(joint, plan.targets, w)
    acked: set[str] = set()  # what the coordinator has when the round is decided
    for site in data.draw(st.permutations(plan.targets)):
        before = round_.decided
        if data.draw(st.booleans(), label=f"{site} acknowledges"):
            round_.ack(site)
        else:
            round_.fail(site)
        if before is not None:
            assert round_.decided == before  # decided once, for good
        elif round_.decided is not None:
            acked = round_.old.acked | round_.new.acked
    if round_.decided is not quorum.Outcome.OK:
        return
    r = n - w + 1  # the smallest R with R + W > N
    for home in (joint.old.home, joint.new.home):
        assert len(acked & set(home)) >= min(w, len(home))
        for reads in itertools.combinations(home, min(r, len(home))):
            assert acked & set(reads), (home, reads, acked)


@settings(max_examples=40, deadline=None)
@given(changes(), st.integers(1, 3), st.sets(st.sampled_from(SITES)), st.integers(1, 3))
def test_an_unmoved_shard_is_planned_as_without_a_change(
    change: membership.Change, n: int, reachable: set[str], w: int
) -> None:
    for shard in SAMPLE[:64]:
        joint = change.replicas(shard, n)
        if joint.moving or w > n:
            continue
        try:
            expected = quorum.plan_write(joint.old, reachable, w)
        except quorum.Unavailable:
            with pytest.raises(quorum.Unavailable):
                membership.plan_write(joint, reachable, w)
            continue
        planned = membership.plan_write(joint, reachable, w)
        assert set(planned.targets) == set(expected.targets)
        assert planned.hints == expected.hints
        assert membership.plan_read(joint, reachable, 1) == expected.targets


def test_reads_stay_on_the_old_home_replicas() -> None:
    change = membership.Change.start(View(1, tuple(SITES[:3])), SITES[:4], 2)
    shard = change.incoming(SITES[3], 3, SAMPLE)[0]
    joint = change.replicas(shard, 3)
    assert SITES[3] in joint.new.home
    assert SITES[3] not in membership.plan_read(joint, set(SITES), 2)
    assert set(membership.plan_read(joint, set(SITES), 2)) == set(SITES[:3])
    # The new home replicas need W reachable as well: with the joining site and one other
    # new home replica down, W=2 of the new set is out of reach.
    down = {SITES[3], next(s for s in joint.new.home if s != SITES[3])}
    with pytest.raises(quorum.Unavailable):
        membership.plan_write(joint, set(SITES) - down, 2)


def test_a_joining_site_pulls_its_shards_then_reads_move_then_writes() -> None:
    old = View(1, tuple(SITES[:3]))
    change = membership.Change.start(old, SITES[:4], 2)
    joining = SITES[3]
    incoming = change.incoming(joining, 3, SAMPLE)
    assert incoming == [s for s in SAMPLE if joining in change.new.replicas(s, 3).home]
    assert abs(len(incoming) / len(SAMPLE) - 3 / 4) < 0.08
    assert all(change.incoming(site, 3, SAMPLE) == [] for site in SITES[:3])
    assert not change.pulled_all(3, {}, SAMPLE)
    assert not change.pulled_all(3, {joining: incoming[:-1]}, SAMPLE)
    assert change.pulled_all(3, {joining: incoming}, SAMPLE)
    # Then reads move to the new home replicas; writes stay dual until every site reads there.
    reading = change.reading_new()
    shard = incoming[0]
    joint = reading.replicas(shard, 3)
    read = membership.plan_read(joint, set(SITES), 3, reading.step)
    assert set(read) == set(joint.new.home)
    assert joining in read
    assert set(membership.plan_write(joint, set(SITES), 2).targets) == set(joint.home)
    steps = dict.fromkeys(SITES[:3], membership.Step.READING_NEW)
    assert not membership.finished(steps, change.new.sites)
    steps[joining] = membership.Step.PULLING
    assert not membership.finished(steps, change.new.sites)
    steps[joining] = membership.Step.READING_NEW
    assert membership.finished(steps, change.new.sites)
    # A leave: the sites that stay take over the leaving site's shards.
    leave = membership.Change.start(View(2, tuple(SITES[:4])), SITES[:3], 3)
    taken = {site: leave.incoming(site, 2, SAMPLE) for site in SITES[:3]}
    held = leave.old.shards_of(SITES[3], 2, SAMPLE)
    assert sorted(s for shards in taken.values() for s in shards) == held
    assert leave.pulled_all(2, taken, SAMPLE)


def test_a_change_must_be_newer_and_change_something() -> None:
    old = View(5, tuple(SITES[:3]))
    with pytest.raises(membership.BadChange, match="not newer"):
        membership.Change.start(old, SITES[:4], 5)
    with pytest.raises(membership.BadChange, match="would not change"):
        membership.Change.start(old, reversed(SITES[:3]), 6)
    with pytest.raises(membership.BadChange, match="at least one site"):
        membership.Change.start(old, [], 6)


def test_a_target_is_refused_for_unknown_sites_or_too_few() -> None:
    view = View(1, tuple(SITES[:2]))
    known = set(SITES[:3])
    assert membership.check_target(view, [SITES[2], SITES[0], SITES[1]], known, 3) == tuple(
        sorted(SITES[:3])
    )
    with pytest.raises(membership.UnknownSites, match=SITES[4]):
        membership.check_target(view, [SITES[0], SITES[4]], known, 1)
    with pytest.raises(membership.TooFewSites):
        membership.check_target(view, [SITES[0]], known, 2)
    with pytest.raises(membership.TooFewSites):
        membership.check_target(view, [], known, 0)


def test_the_steps_need_every_participant() -> None:
    change = membership.Change.start(View(1, tuple(SITES[:2])), SITES[:3], 2)
    everyone = SITES[:3]
    reports = {SITES[0]: membership.Report.INSTALLED, SITES[1]: membership.Report.PULLED}
    assert not membership.may_pull(reports, everyone)
    reports[SITES[2]] = membership.Report.INSTALLED
    assert membership.may_pull(reports, everyone)
    assert not membership.may_read_new(change, reports)
    reports[SITES[0]] = reports[SITES[2]] = membership.Report.PULLED
    assert membership.may_read_new(change, reports)
    assert not membership.all_read_new(reports, everyone)
    reports = dict.fromkeys(everyone[:2], membership.Report.READING_NEW)
    reports[SITES[2]] = membership.Report.DONE
    assert membership.all_read_new(reports, everyone)


def test_a_forgotten_site_is_not_waited_for_and_its_removal_has_one_starter() -> None:
    """A dead joiner (forgotten) never reports PULLED: the others read the new set without it;
    the removal then drops every forgotten site of the view, started by the lowest live site."""
    change = membership.Change.start(View(1, tuple(SITES[:2])), SITES[:3], 2)
    pulled = dict.fromkeys(SITES[:2], membership.Report.PULLED)
    assert not membership.may_read_new(change, pulled)
    assert membership.may_read_new(change, pulled, forgotten={SITES[2]})
    view = change.new
    assert membership.removal(view, {SITES[2]}) == tuple(sorted(SITES[:2]))
    assert membership.removal(view, {SITES[4]}) is None  # not in the view: nothing to remove
    assert membership.removal(View(1, (SITES[0],)), {SITES[0]}) is None  # none would be left
    assert membership.starter(view, {SITES[0]}) == min(SITES[1:3])
    assert membership.starter(View(1, (SITES[0],)), {SITES[0]}) is None


@given(st.integers(1, 7))
def test_a_pull_quorum_meets_every_default_write_quorum(home: int) -> None:
    assert membership.pull_quorum(home) + (home // 2 + 1) > home
    assert 1 <= membership.pull_quorum(home) <= home


@given(changes())
def test_a_change_survives_its_encoding(change: membership.Change) -> None:
    assert membership.decode_change(membership.encode_change(change)) == change
    moved = change.reading_new()
    assert membership.decode_change(membership.encode_change(moved)) == moved


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(0, 65_535), st.data())
def test_majorities_per_view_meet_in_each_view(
    old_count: int, shard: int, data: st.DataObject
) -> None:
    """Relay's own namespaces (N = 7, quorums a majority of the home set): a joint write
    acknowledged by a majority of each view meets every majority read of either view."""
    old = SITES[:old_count]
    new = SITES[: old_count + 1] if data.draw(st.booleans()) or old_count == 1 else old[1:]
    change = membership.Change.start(View(1, tuple(old)), new, 2)
    joint = change.replicas(shard, 7)
    w_old, w_new = membership.majorities(joint)
    plan = membership.plan_write(joint, set(SITES), w_old, w_new)
    round_ = membership.JointWriteRound(joint, plan.targets, w_old, w_new)
    acked: set[str] = set()
    for site in data.draw(st.permutations(plan.targets)):
        round_.ack(site)
        acked.add(site)
        if round_.decided is quorum.Outcome.OK:
            break
    assert round_.decided is quorum.Outcome.OK
    for home, r in ((joint.old.home, w_old), (joint.new.home, w_new)):
        for read in itertools.combinations(home, r):
            assert acked & set(read), (home, r, acked)
