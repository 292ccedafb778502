"""The move state machine (`relay_operator.moves`): the calls of a move in order, approval, the
pause budget and digests deciding a rollback, retries and timeouts, and a resume from any
persisted status making the step in progress again. Pure: answers are written here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relay_operator import moves, times

MOVE = moves.Move(
    name="qw-g3-p2", partition=2, source=0, target=1, generation=3, before=(0, 0, 0, 0), replicas=2
)
POLICY = moves.Policy(budget_s=2.0, timeout_s=30.0, keep_s=10.0)
T0 = 1_000_000.0
ROLLBACK = [("return", 0), ("withdraw", 1), ("retake", 0), ("forget", 1)]


def ok(call: moves.Call) -> moves.Answer:
    """What a healthy pool answers: equal digests, the target serving after the commit."""
    body: dict[str, Any] = {"digest": "d1", "mark": "m7"}
    if call.step in ("commit", "retake"):
        body["serving"] = [2]
    return moves.Answer(200, body)


def run(
    status: dict[str, Any],
    answer: Callable[[moves.Call], moves.Answer] = ok,
    *,
    clock: list[float] | None = None,
    step_s: float = 0.1,
    approved: bool = True,
    limit: int = 100,
) -> tuple[dict[str, Any], list[moves.Call], list[dict[str, Any]]]:
    """Drive the move as the operator does (persist, call, decide again) until nothing is to
    be called now; each call takes `step_s` of the clock. Returns the last status, the calls
    made and every status persisted."""
    clock = clock if clock is not None else [T0]
    calls: list[moves.Call] = []
    persisted: list[dict[str, Any]] = []
    last: tuple[moves.Call, moves.Answer] | None = None
    tries = 0
    for _ in range(limit):
        nxt = moves.decide(MOVE, status, POLICY, clock[0], approved=approved, last=last)
        status = nxt.status
        persisted.append(status)
        if nxt.call is None:
            return status, calls, persisted
        clock[0] += nxt.delay_s + step_s
        calls.append(nxt.call)
        got = answer(nxt.call)
        tries = tries + 1 if last is not None and last[0] == nxt.call else 0
        last = (nxt.call, got)
    raise AssertionError(f"no end after {limit} steps: {status}")


def steps(calls: list[moves.Call]) -> list[tuple[str, int]]:
    return [(c.step, c.on) for c in calls]


def test_a_move_runs_prefetch_pause_catch_up_commit_then_releases_after_the_keeping_time() -> None:
    clock = [T0]
    status, calls, _ = run({}, clock=clock)
    assert steps(calls) == [("prefetch", 1), ("pause", 0), ("catch-up", 1), ("commit", 1)]
    assert calls[1].body == {
        "generation": 3,
        "partitions": 4,
        "replicas": 2,
        "assignment": [0, 0, 1, 0],
    }
    assert calls[3].body == calls[1].body
    assert calls[0].source_url
    assert calls[2].source_url
    assert (status["phase"], status["installed"]) == ("Committed", True)
    assert moves.installed(status)
    assert not moves.finished(status)
    assert status["pauseMs"] == 300.0  # pause, catch-up and commit: three calls of 0.1 s
    assert status["catchUpMs"] == 200.0  # what the budget bounds: pause and catch-up
    assert status["sourceDigest"] == status["targetDigest"] == "d1"
    # The source keeps its copy for `keep_s`; then it is released.
    clock[0] += 5
    assert run(status, clock=clock)[1] == []
    clock[0] += 5.01
    status, calls, _ = run(status, clock=clock)
    assert steps(calls) == [("release", 0)]
    assert calls[0].method == "DELETE"
    assert calls[0].path == "/internal/partitions/2"
    assert status["phase"] == "Released"
    assert moves.finished(status)
    assert run(status, clock=clock)[1] == []  # finished: nothing runs again


def test_a_manual_move_waits_in_planned_until_approved() -> None:
    status, calls, _ = run({}, approved=False)
    assert calls == []
    assert status["phase"] == "Planned"
    assert moves.APPROVED in status["message"]
    status, calls, _ = run(status, approved=True)
    assert steps(calls)[0] == ("prefetch", 1)


def test_digests_that_differ_roll_back_source_first_then_the_target_forgets() -> None:
    def differ(call: moves.Call) -> moves.Answer:
        answer = ok(call)
        return moves.Answer(200, {"digest": "other"}) if call.step == "catch-up" else answer

    status, calls, _ = run({}, differ)
    assert steps(calls) == [
        ("prefetch", 1),
        ("pause", 0),
        ("catch-up", 1),
        ("return", 0),
        ("withdraw", 1),
        ("retake", 0),
        ("forget", 1),
    ]
    back = {"generation": 4, "partitions": 4, "replicas": 2, "assignment": [0, 0, 0, 0]}
    assert calls[3].body == calls[4].body == calls[5].body == back
    assert (calls[6].method, calls[6].path) == ("DELETE", "/internal/partitions/2")
    assert status["phase"] == "RolledBack"
    assert moves.finished(status)
    assert "digest differs" in status["message"]
    assert status["message"].startswith("rolled back")


def test_a_target_serving_the_partition_before_its_catch_up_rolls_back() -> None:
    # The target restarted after the pause and took the source's publication up (0019).
    def served(call: moves.Call) -> moves.Answer:
        if call.step == "catch-up":
            return moves.Answer(409, {"error": "PARTITION_SERVED", "detail": "served here"})
        return ok(call)

    status, calls, _ = run({}, served)
    assert steps(calls)[2:] == [("catch-up", 1), *ROLLBACK]
    assert status["phase"] == "RolledBack"
    assert "serves the partition before its catch-up" in status["message"]


def test_a_pause_past_its_budget_rolls_back_and_never_commits() -> None:
    status, calls, _ = run({}, step_s=0.8)  # pause + catch-up = 1.6 s, + the commit
    assert steps(calls)[-1] == ("commit", 1)  # within the budget when the catch-up answered
    status, calls, _ = run({}, step_s=1.1)
    assert ("commit", 1) not in steps(calls)
    assert steps(calls)[3:] == [("return", 0), ("withdraw", 1), ("retake", 0), ("forget", 1)]
    assert "past its budget" in status["message"]
    assert status["phase"] == "RolledBack"


def test_a_resumed_move_makes_the_step_in_progress_again() -> None:
    # Every status a run persists, read back by a restarted operator at once, gives the call
    # that was being made (idempotent on the services' side) or nothing new to do.
    _, _calls, persisted = run({})
    for status in persisted[1:-1]:
        nxt = moves.decide(MOVE, status, POLICY, T0 + 0.5, approved=True)
        assert nxt.call is not None
        assert nxt.call.step == moves._step_of(status), status
    # The same, after a restart that took longer than the budget: mid-pause, it rolls back.
    paused = next(s for s in persisted if s["phase"] == "CatchingUp")
    late = moves.decide(MOVE, paused, POLICY, T0 + 10, approved=True)
    assert late.status["phase"] == "RolledBack"
    assert late.call is not None
    assert late.call.step == "return"
    # A started move keeps the owners and replicas it started with, whatever the pool says.
    started = persisted[1]
    assert (started["before"], started["replicas"]) == ([0, 0, 0, 0], 2)
    other = moves.Move(MOVE.name, 2, 0, 1, 3, before=(0, 1, 0, 1), replicas=3)
    assert moves.resumed(other, started) == MOVE
    assert moves.resumed(other, {"phase": "Planned"}) == other
    committed = next(s for s in persisted if s["phase"] == "Committed")
    again = moves.decide(MOVE, committed, POLICY, T0 + 10, approved=True)
    assert again.status["phase"] == "Committed"
    assert again.call is not None
    assert again.call.step == "commit"  # once decided, a commit only goes forward


def test_transient_failures_are_retried_and_a_step_past_its_timeout_fails() -> None:
    flaky = iter([moves.Answer(None, {"detail": "refused"}), moves.Answer(503, {})])

    def first_two_fail(call: moves.Call) -> moves.Answer:
        return next(flaky, None) or ok(call)

    status, calls, persisted = run({}, first_two_fail)
    assert steps(calls)[:3] == [("prefetch", 1)] * 3
    # A retry keeps the phase's message and says what failed; the next phase forgets it.
    assert persisted[1]["message"] == "prefetching on the target"
    assert persisted[1]["lastError"] == "prefetch: no answer (refused)"
    assert persisted[2]["lastError"] == "prefetch: 503"
    assert persisted[3]["lastError"] is None
    assert status["phase"] == "Committed"

    def target_gone(call: moves.Call) -> moves.Answer:
        return moves.Answer(502, {"error": "SOURCE_UNAVAILABLE"})

    status, calls, _ = run({}, target_gone, step_s=1.0)
    assert status["phase"] == "Failed"
    assert moves.finished(status)
    assert "prefetch did not succeed within 30 s" in status["message"]
    assert {c.step for c in calls} == {"prefetch"}


def test_a_refusal_that_retrying_cannot_change_fails_the_move() -> None:
    def stale(call: moves.Call) -> moves.Answer:
        if call.step == "pause":
            return moves.Answer(409, {"error": "STALE_GENERATION", "detail": "5 is newer"})
        return ok(call)

    status, calls, _ = run({}, stale)
    assert steps(calls) == [("prefetch", 1), ("pause", 0)]
    assert status["phase"] == "Failed"
    assert "pause on ordinal 0: 409 STALE_GENERATION 5 is newer" in status["message"]


def test_a_commit_waits_while_the_target_has_the_partition_pending() -> None:
    pending: list[list[int]] = [[], []]
    left = iter(pending)

    def late(call: moves.Call) -> moves.Answer:
        if call.step == "commit":
            return moves.Answer(200, {"serving": next(left, [2])})
        return ok(call)

    status, calls, _ = run({}, late, step_s=0.01)
    assert steps(calls)[3:] == [("commit", 1)] * 3
    assert moves.installed(status)


ANSWERS = st.sampled_from(["ok", "ok", "ok", "none", "503", "differ", "stale"])


@settings(max_examples=300, deadline=None)
@given(answers=st.lists(ANSWERS, min_size=1, max_size=40), step_s=st.floats(0.01, 1.5))
def test_whatever_the_answers_a_move_commits_only_within_budget_with_equal_digests(
    answers: list[str], step_s: float
) -> None:
    script = iter(answers)

    def scripted(call: moves.Call) -> moves.Answer:
        kind = next(script, "ok")
        if kind == "none":
            return moves.Answer(None, {"detail": "timeout"})
        if kind == "503":
            return moves.Answer(503, {"error": "UNAVAILABLE"})
        if kind == "stale":
            return moves.Answer(409, {"error": "STALE_GENERATION"})
        answer = ok(call)
        if kind == "differ" and call.step == "catch-up":
            return moves.Answer(200, {"digest": "x"})
        return answer

    clock = [T0]
    status, calls, persisted = run({}, scripted, clock=clock, step_s=step_s, limit=400)
    phases = [s["phase"] for s in persisted]
    if "Committed" in phases:
        first = phases.index("Committed")
        assert "RolledBack" not in phases[first:]
        decided = persisted[first]
        assert decided["sourceDigest"] == decided["targetDigest"]
        paused = (times.parse(decided["phaseAt"]) or 0) - (times.parse(decided["pausedAt"]) or 0)
        assert paused <= POLICY.budget_s + 1e-6
        assert decided["catchUpMs"] <= POLICY.budget_s * 1000
    # The source is paused only by a pause of this generation, and given back only by one newer.
    for call in calls:
        if call.step in ("return", "withdraw", "retake"):
            assert call.body is not None
            assert call.body["generation"] == 4
    # A finished move stays finished.
    if moves.finished(status):
        assert moves.decide(MOVE, status, POLICY, clock[0] + 100, approved=True).call is None
