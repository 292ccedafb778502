"""The operator's pure rules: dump due times, dump answers, conditions, partition plans, DS
replica targets, retries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_operator import backoff, conditions, dsreplicas, dumps, pools, times

POLICY = dumps.Policy(interval_s=3600, timeout_s=120, retry_s=60)


def test_times_round_trip_to_the_millisecond() -> None:
    assert times.parse(times.iso(1700000000.123)) == 1700000000.123
    assert times.iso(0) == "1970-01-01T00:00:00.000Z"
    assert times.parse("garbage") is None
    assert times.parse(None) is None


def test_the_first_dump_is_due_at_once_and_then_one_interval_after_the_last_attempt() -> None:
    assert dumps.is_due(None, POLICY, now=1.0)
    done = dumps.record(None, dumps.Outcome(ok=True, dump=4), started=1000.0)
    assert dumps.due_at(done, POLICY) == 4600.0
    assert not dumps.is_due(done, POLICY, now=4599.9)
    assert dumps.is_due(done, POLICY, now=4600.0)


def test_a_restarted_operator_reads_the_due_time_from_the_status_only() -> None:
    # What kopf hands the timer after a restart is the object: the status decides, so a dump
    # recorded a minute ago is not repeated however soon the timer fires.
    status = {"lastAttemptAt": times.iso(10_000.0), "lastSuccessAt": times.iso(10_000.0)}
    assert not dumps.is_due(status, POLICY, now=10_060.0)
    assert dumps.is_due(status, POLICY, now=13_600.0)


def test_a_failed_attempt_is_retried_sooner_but_never_later_than_the_interval() -> None:
    failed = dumps.record(None, dumps.Outcome(ok=False, error="503"), started=1000.0)
    assert failed["failures"] == 1
    assert dumps.due_at(failed, POLICY) == 1060.0
    short = dumps.Policy(interval_s=30, timeout_s=10, retry_s=60)
    assert dumps.due_at(failed, short) == 1030.0


def test_an_interval_of_zero_switches_the_operators_dumps_off() -> None:
    assert dumps.due_at(None, dumps.Policy(0, 10, 60)) is None
    assert not dumps.is_due(None, dumps.Policy(0, 10, 60), now=1e12)


def test_a_finished_dump_records_every_writers_figures() -> None:
    body = {
        "dump": 7,
        "writers": [
            {
                "instance": "qw-0",
                "partitions": [0, 2],
                "dump": 7,
                "records": 10,
                "bytes": 640,
                "pause_ms": 1.5,
                "total_s": 0.2,
            },
            {"instance": "qw-1", "partitions": [1, 3], "dump": 3, "records": 0, "bytes": 0},
        ],
    }
    outcome = dumps.from_answer(200, body)
    assert outcome.ok
    new = dumps.record({"failures": 2}, outcome, started=50.0)
    assert new["dump"] == 7
    assert new["failures"] == 0
    assert new["writers"][0] == {
        "instance": "qw-0",
        "partitions": [0, 2],
        "dump": 7,
        "records": 10,
        "bytes": 640,
        "pauseMs": 1.5,
        "totalSeconds": 0.2,
    }
    assert new["writers"][1] == {
        "instance": "qw-1",
        "partitions": [1, 3],
        "dump": 3,
        "records": 0,
        "bytes": 0,
    }
    condition = dumps.condition(outcome, POLICY)
    assert condition.status == "True"
    assert "longest pause 1.5 ms" in condition.message


def test_a_503_names_the_partitions_that_did_not_answer() -> None:
    detail = (
        "no answer within 5 s for command partitions [1, 3, 7] (is every queue-writer running?)"
    )
    outcome = dumps.from_answer(503, {"error": "UNAVAILABLE", "detail": detail})
    assert not outcome.ok
    assert outcome.missing == [1, 3, 7]
    condition = dumps.condition(outcome, POLICY)
    assert (condition.status, condition.reason) == ("False", "PartitionsSilent")
    assert "[1, 3, 7]" in condition.message
    previous = {"lastSuccessAt": "t0", "dump": 3, "writers": [{"instance": "a"}]}
    new = dumps.record(previous, outcome, started=9.0)
    # The last good figures stay; the failure and the silent partitions are added.
    assert (new["dump"], new["lastSuccessAt"], new["writers"]) == (3, "t0", [{"instance": "a"}])
    assert new["missingPartitions"] == [1, 3, 7]
    assert new["failures"] == 1


def test_other_failures_say_what_came_back() -> None:
    outcome = dumps.from_answer(403, {"error": "FORBIDDEN", "detail": "admin token missing"})
    condition = dumps.condition(outcome, POLICY)
    assert (condition.status, condition.reason) == ("False", "DumpFailed")
    assert "403" in condition.message
    assert "admin token missing" in condition.message
    assert dumps.missing_partitions("something else") == []


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = conditions.merge(None, conditions.Condition("A", "True", "R", "m1"), "t1")
    again = conditions.merge(first, conditions.Condition("A", "True", "R2", "m2"), "t2")
    assert again == [
        {"type": "A", "status": "True", "reason": "R2", "message": "m2", "lastTransitionTime": "t1"}
    ]
    flipped = conditions.merge(again, conditions.Condition("A", "False", "R", "m"), "t3")
    assert flipped[0]["lastTransitionTime"] == "t3"
    both = conditions.merge(flipped, conditions.Condition("B", "True", "R", "m"), "t4")
    assert [c["type"] for c in both] == ["A", "B"]
    assert conditions.find(both, "B") == both[1]
    assert conditions.find(both, "C") is None


@given(
    partitions=st.integers(1, 64),
    start=st.integers(1, 16),
    wanted=st.integers(1, 16),
)
def test_a_plan_leaves_one_balanced_owner_per_partition_and_moves_as_little_as_it_can(
    partitions: int, start: int, wanted: int
) -> None:
    before = pools.initial(partitions, start)
    moves = pools.plan(before, wanted)
    after = pools.apply(before, moves)
    assert all(0 <= owner < wanted for owner in after)
    loads = [after.count(k) for k in range(wanted)]
    assert max(loads) - min(loads) <= 1
    moved = {m.partition for m in moves}
    assert all(before[m.partition] != m.target for m in moves)
    # Minimal: every move is forced (owner removed, or above the share it can keep).
    assert len(moved) == len(moves)
    share = -(-partitions // wanted)
    forced = sum(1 for owner in before if owner >= wanted) + sum(
        max(0, before.count(k) - share) for k in range(min(start, wanted))
    )
    assert len(moves) >= forced
    base = partitions // wanted
    assert len(moves) <= forced + sum(
        max(0, before.count(k) - base) for k in range(min(start, wanted))
    )
    assert pools.plan(after, wanted) == []


def test_one_to_two_moves_half_the_partitions_to_the_new_ordinal() -> None:
    moves = pools.plan(pools.initial(8, 1), 2)
    assert [(m.source, m.target) for m in moves] == [(0, 1)] * 4
    back = pools.plan(pools.apply(pools.initial(8, 1), moves), 1)
    assert sorted(m.partition for m in back) == sorted(m.partition for m in moves)


def _answer(generation: int, owners: list[int]) -> dict[str, Any]:
    """What a service answers at `GET /internal/ownership` (only the part the operator reads)."""
    record = {"generation": generation, "partitions": len(owners), "replicas": 2}
    return {"generation": generation, "assignment": {**record, "assignment": owners}}


def test_a_pool_adopts_the_newest_assignment_its_instances_report() -> None:
    # No answer (or only instances waiting for their first one): p mod n, generation 1.
    assert pools.adopted(4, 2, []) == (1, [0, 1, 0, 1])
    assert pools.adopted(4, 2, [{"assignment": None}]) == (1, [0, 1, 0, 1])
    # The services moved on (generation 3 on one instance, 2 still on another): the newest.
    reported = [_answer(2, [0, 0, 1, 1]), _answer(3, [0, 1, 1, 1]), _answer(2, [0, 0, 1, 1])]
    assert pools.adopted(4, 3, reported) == (3, [0, 1, 1, 1])


def test_a_pool_adopts_nothing_from_conflicting_or_foreign_reports() -> None:
    for reported, message in (
        ([_answer(2, [0, 0, 1, 1]), _answer(2, [1, 0, 1, 1])], "different owners"),
        ([_answer(2, [0, 0, 1])], "reports 3 partitions"),
    ):
        with pytest.raises(ValueError, match=message):
            pools.adopted(4, 2, reported)


def test_a_move_is_named_by_its_pool_generation_and_partition() -> None:
    moves = pools.plan(pools.initial(4, 2), 3)
    assert pools.move_name("qw", 3, moves[0]) == f"qw-g3-p{moves[0].partition}"


@given(partitions=st.integers(1, 32), start=st.integers(1, 8), wanted=st.integers(1, 8))
def test_a_schedule_runs_a_scale_up_in_partition_order_and_a_scale_down_from_the_top(
    partitions: int, start: int, wanted: int
) -> None:
    before = pools.initial(partitions, start)
    moves = pools.plan(before, wanted)
    scheduled = pools.schedule(5, moves, shrinking=wanted < start)
    generations = [g for g, _ in scheduled]
    # One generation per move and one free after each (its rollback's): none shared.
    assert generations == [5 + 2 * i + 1 for i in range(len(moves))]
    assert sorted((m for _, m in scheduled), key=lambda m: m.partition) == moves
    order = [m for _, m in scheduled]
    if wanted < start:
        assert [m.source for m in order] == sorted((m.source for m in order), reverse=True)
    else:
        assert [m.partition for m in order] == sorted(m.partition for m in order)
    # Applied one at a time in this order, every step is a valid assignment.
    owners = list(before)
    for _, move in scheduled:
        owners = pools.apply(owners, [move])
    assert owners == pools.apply(before, moves)


def test_an_instance_is_addressed_at_its_ready_pods_ip_only() -> None:
    def pod(ip: str | None, ready: str, deleting: bool = False) -> dict[str, Any]:
        meta = {
            "name": "qw-1",
            **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {}),
        }
        status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready}]}
        if ip:
            status["podIP"] = ip
        return {"metadata": meta, "status": status}

    assert pools.address(pod("10.1.2.3", "True"), 8080) == "http://10.1.2.3:8080"
    assert pools.address(pod("fd00::5", "True"), 81) == "http://[fd00::5]:81"
    assert pools.address(pod("10.1.2.3", "False"), 8080) is None
    assert pools.address(pod(None, "True"), 8080) is None
    assert pools.address(pod("10.1.2.3", "True", deleting=True), 8080) is None
    assert pools.address({}, 8080) is None


def test_a_statefulset_is_restored_only_when_it_differs_from_the_owners_in_force() -> None:
    assert pools.restore_replicas(2, 5) == 2
    assert pools.restore_replicas(2, 2) is None
    assert pools.restore_replicas(None, 5) is None


INFO = {
    "sites": [
        {"site": "000000000000000c", "up": True},
        {"site": "000000000000000a", "up": True},
        {"site": "000000000000000b", "up": False},
        {"site": "000000000000000d", "up": True},
    ],
    "storages": [
        {
            "name": "messages",
            "shards": [
                {
                    "id": "0",
                    "replicas": [
                        {"site": "000000000000000b", "status": "up"},
                        {"site": "000000000000000d", "status": "up"},
                    ],
                    "transitions": [{"site": "000000000000000a", "transition": "joining"}],
                }
            ],
        }
    ],
}


def test_explicit_sites_are_the_target_as_given() -> None:
    spec = {"database": "messages", "sites": ["000000000000000b", "000000000000000a"]}
    assert dsreplicas.target(spec, INFO) == ["000000000000000b", "000000000000000a"]


def test_pods_are_the_sites_they_host_now_and_an_unknown_pod_resolves_nothing() -> None:
    info = {
        "sites": [
            {"site": "000000000000000a", "node": "relay-retainer-0", "up": False},  # old volume
            {"site": "000000000000000e", "node": "relay-retainer-0", "up": True},  # replaced
            {"site": "000000000000000b", "node": "relay-retainer-1", "up": True},
        ]
    }
    spec = {"database": "messages", "pods": ["relay-retainer-1", "relay-retainer-0"]}
    assert dsreplicas.target(spec, info) == ["000000000000000b", "000000000000000e"]
    with pytest.raises(dsreplicas.Unresolved, match="relay-retainer-2"):
        dsreplicas.target({**spec, "pods": ["relay-retainer-0", "relay-retainer-2"]}, info)
    down = {"sites": [{"site": "000000000000000a", "node": "relay-retainer-0", "up": False}]}
    with pytest.raises(dsreplicas.Unresolved, match="none up"):
        dsreplicas.target({**spec, "pods": ["relay-retainer-0"]}, down)


def test_a_replication_factor_keeps_live_replicas_then_adds_sites_in_id_order() -> None:
    spec = {"database": "messages", "replicationFactor": 2}
    # d is a live replica (kept); b is down (dropped); a is the first other up site.
    assert dsreplicas.target(spec, INFO) == ["000000000000000a", "000000000000000d"]
    assert dsreplicas.target({**spec, "replicationFactor": 1}, INFO) == ["000000000000000d"]


def test_the_status_mirrors_the_storage_and_counts_replicas_on_sites_that_are_down() -> None:
    status = dsreplicas.mirror(INFO, "messages", ["000000000000000d"])
    assert status["replicas"] == "000000000000000b,000000000000000d"
    assert status["lostReplicas"] == 1
    assert status["shards"][0]["transitions"] == [
        {"site": "000000000000000a", "transition": "joining"}
    ]
    assert dsreplicas.mirror(INFO, "other", [])["shards"] == []


def test_a_refusal_carries_the_servers_message() -> None:
    condition = dsreplicas.refused(400, "unknown sites: ['0123456789abcdef']")
    assert (condition.status, condition.reason) == ("False", "Refused")
    assert "unknown sites" in condition.message


def test_backoff_grows_to_its_cap_and_retries_only_what_says_try_again() -> None:
    delays = list(backoff.Backoff(attempts=6, base_s=1, factor=3, cap_s=10).delays())
    assert delays == [1, 3, 9, 10, 10]
    assert all(backoff.retryable(s) for s in (None, 409, 429, 500, 503))
    assert not any(backoff.retryable(s) for s in (400, 403, 404, 422))


def test_ready_means_every_pool_adopted_and_all_its_owners_ready() -> None:
    assert pools.readiness([]).status == "False"
    states = [
        {"pool": "queue-writer", "held": 2, "ready": 2},
        {"pool": "retainer", "held": 1, "ready": 0},
    ]
    not_ready = pools.readiness(states)
    assert (not_ready.status, not_ready.message) == ("False", "retainer: 0/1 ready")
    assert pools.readiness(states[:1]).status == "True"
    assert pools.readiness([{"pool": "p", "held": None, "ready": None}]).status == "False"
    assert pools.migrating().status == "False"
    running = pools.migrating("qw-g2-p1: p1 0->1")
    assert (running.status, running.reason, running.message) == (
        "True",
        "MoveRunning",
        "qw-g2-p1: p1 0->1",
    )


def test_only_planned_moves_outside_the_current_plan_are_superseded() -> None:
    def move(name: str, to: int, pool: str = "qw", phase: str | None = "Planned") -> dict[str, Any]:
        spec = {"pool": pool, "partition": 0, "fromOrdinal": 0, "toOrdinal": to, "generation": 2}
        return {
            "metadata": {"name": name},
            "spec": spec,
            "status": {"phase": phase} if phase else {},
        }

    existing = [
        move("qw-g2-p6", 2),
        move("qw-g2-p7", 2),
        move("qw-g2-p5", 2, phase="Paused"),  # started: never dropped here
        move("rt-g2-p1", 2, pool="rt"),
        move("qw-g2-p4", 2, phase=None),  # created, phase not yet written: Planned
    ]
    plan = {"qw-g2-p7": existing[1]["spec"], "qw-g2-p6": {**existing[0]["spec"], "toOrdinal": 3}}
    # p6 is planned again with another target, p4 no longer: both go; p7 stays as it is.
    assert pools.superseded(existing, "qw", plan) == ["qw-g2-p4", "qw-g2-p6"]
    assert pools.superseded(existing, "qw", {}) == ["qw-g2-p4", "qw-g2-p6", "qw-g2-p7"]
    assert pools.move_spec("qw", 2, pools.Move(6, 0, 3)) == {
        "pool": "qw",
        "partition": 6,
        "fromOrdinal": 0,
        "toOrdinal": 3,
        "generation": 2,
    }


def _finished(name: str, generation: int, phase: str, finished_s: float | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if finished_s is not None:
        status["finishedAt"] = times.iso(finished_s)
    return {"metadata": {"name": name}, "spec": {"generation": generation}, "status": status}


def test_finished_moves_are_deleted_after_their_retention_once_the_pool_counts_them() -> None:
    now, day = 1_800_000_000.0, 86_400.0
    existing = [
        _finished("released-old", 2, "Released", now - 8 * day),
        _finished("released-new", 3, "Released", now - day),
        _finished("rolled-back-old", 4, "RolledBack", now - 8 * day),
        _finished("failed-old", 5, "Failed", now - 8 * day),
        _finished("rolling-back", 6, "RolledBack", None),  # its steps still running
        _finished("ahead-of-the-pool", 9, "Released", now - 8 * day),
    ]
    # The pool counts up to generation 5: the rollback of 4 (its generation + 1) included.
    assert pools.expired(existing, 5, now, 7 * day) == ["released-old", "rolled-back-old"]
    # Not yet counted: a rolled-back move of generation 4 needs the pool at 5.
    assert pools.expired(existing, 4, now, 7 * day) == ["released-old"]
    assert pools.expired(existing, 9, now, 0) == [
        "ahead-of-the-pool",
        "released-new",
        "released-old",
        "rolled-back-old",
    ]
