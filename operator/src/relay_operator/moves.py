"""The run of one RelayPartitionMove (of a queue-writer or a retainer pool), as a state
machine over its status.

A move of partition p from ordinal S (source) to T (target) under generation g (decision 0019,
"The move"; decision 0020): prefetch on T while S serves; pause on S with g (its fence); catch-up
on T, the digest compared with the pause's; commit (`PUT /internal/ownership` of g on T); release
(`DELETE` of p on S) once the keeping time passed. A pause past its budget, or digests that
differ, roll back: generation g + 1 (`rollback_generation`) giving p back, installed on S, then
on T, then on S again until S serves p, then T forgets what it imported.

`decide` is the whole rule: from the persisted status (and the answer to the call just made, if
any) it gives the status to write and the next call. The status is written *before* its call
(the phase names the step being run), so an operator restarted at any point finds the step to
run again in the status, and every step is idempotent per (move, generation) on the services'
side (an install of the generation in force, a pull or import of the same unit, a delete of a
forgotten partition: each again changes nothing). Invariants kept here:

- a move goes forward to Committed only with both digests equal and the pause (from `pausedAt`,
  persisted before the pause call, to the catch-up's answer: `catchUpMs`) within the budget;
  once Committed it never rolls back (`pauseMs`, to the commit's answer, may pass the budget by
  the commit's own time);
- a target found serving the partition before its catch-up (it restarted and took the
  generation up from the source's publication, 0019) rolls back: its state was never compared;
- a pause found past its budget at any point before Committed (a slow call, no answer, an
  operator restarted mid-pause) rolls back, so the source never stays fenced past the budget
  plus one call's timeout while the operator can reach it;
- a step that does not succeed within `timeout_s` of its phase's start is Failed (terminal: a
  person looks; the pool blocks its scale), and so is a refusal that retrying cannot change
  (4xx other than the transient 409s below, a stale or conflicting generation);
- nothing runs in Planned until the move is approved.

Pure: no clock is read and nothing is called here; `now` and the answers are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from relay_operator import times

PLANNED, PREFETCHING, PAUSED, CATCHING_UP = "Planned", "Prefetching", "Paused", "CatchingUp"
COMMITTED, RELEASED, ROLLED_BACK, FAILED = "Committed", "Released", "RolledBack", "Failed"
RUNNING = frozenset({PREFETCHING, PAUSED, CATCHING_UP, COMMITTED})
APPROVED = "relay.dev/approved"
"""The annotation (value "true") that lets a move planned under `approval: Manual` run."""
RETRY_S = 0.2
"""Wait before a step's call is made again after a transient failure (doubled per try, to 5 s;
within the pause: at most a tenth of the budget)."""
TRANSIENT = frozenset({"SOURCE_SERVING", "SOURCE_UNAVAILABLE", "UNAVAILABLE"})
"""Error codes of the hand-off routes that a later call of the same step can get past."""


@dataclass(frozen=True)
class Move:
    """One move and what its calls need: the owners in force before it (generation g - 1 or
    older) and the pool's instances while it runs (the assignment's `replicas`)."""

    name: str
    partition: int
    source: int
    target: int
    generation: int
    before: tuple[int, ...]
    replicas: int

    @property
    def after(self) -> tuple[int, ...]:
        owners = list(self.before)
        owners[self.partition] = self.target
        return tuple(owners)

    @property
    def rollback_generation(self) -> int:
        """The generation giving the partition back (the planner leaves it unused)."""
        return self.generation + 1

    def assignment(self, generation: int, owners: tuple[int, ...]) -> dict[str, Any]:
        """A body of `PUT /internal/ownership` (and of `pause`)."""
        return {
            "generation": generation,
            "partitions": len(owners),
            "replicas": self.replicas,
            "assignment": list(owners),
        }


def resumed(move: Move, status: dict[str, Any]) -> Move:
    """`move` with the owners and `replicas` its status recorded when it started (a started
    move's install bodies never change, whatever the pool's status says by then)."""
    if "before" not in status:
        return move
    return replace(
        move,
        before=tuple(int(o) for o in status["before"]),
        replicas=int(status.get("replicas", move.replicas)),
    )


@dataclass(frozen=True)
class Policy:
    budget_s: float = 2.0
    """Longest pause: from the pause call to the catch-up's answer (RelayCluster
    `moveBudgetSeconds`)."""
    timeout_s: float = 300.0
    """Longest time one phase may take before the move is Failed (`moveTimeoutSeconds`)."""
    keep_s: float = 60.0
    """How long the source keeps its copy after the commit (`moveKeepSeconds`)."""


Step = Literal[
    "prefetch", "pause", "catch-up", "commit", "release", "return", "withdraw", "retake", "forget"
]

ROLLBACK_STEPS: tuple[Step, ...] = ("return", "withdraw", "retake", "forget")
"""Give the partition back on the source, withdraw it on the target, install on the source
again until it serves it (a target that published the move's generation holds it pending
there until its withdrawal), and the target forgets its copy."""


@dataclass(frozen=True)
class Call:
    """One HTTP call to an instance of the pool (`on`: the source's or the target's ordinal)."""

    step: Step
    on: int
    method: str
    path: str
    body: dict[str, Any] | None = None
    source_url: bool = False
    """The body is `{"source": <the source instance's URL>}` (the caller knows the URL)."""


@dataclass(frozen=True)
class Answer:
    """What came back: the HTTP status (None: no answer, refused or timed out) and JSON body."""

    status: int | None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return str(self.body.get("error", ""))

    def describe(self) -> str:
        if self.status is None:
            return f"no answer ({self.body.get('detail', '')})"
        detail = self.body.get("detail", "")
        return f"{self.status} {self.code} {detail}".strip()


@dataclass(frozen=True)
class Next:
    status: dict[str, Any]
    """The status to persist (before `call` is made)."""
    call: Call | None = None
    """The next call, or None: nothing to do now (waiting, or finished)."""
    delay_s: float = 0.0
    """Wait before making `call` (a retry)."""


def finished(status: dict[str, Any]) -> bool:
    """Nothing more will run for this move: released, rolled back (its steps done), or failed."""
    phase = status.get("phase", PLANNED)
    return phase == FAILED or (phase in (RELEASED, ROLLED_BACK) and "finishedAt" in status)


def installed(status: dict[str, Any]) -> bool:
    """The target serves the partition under the move's generation (the move is in force)."""
    return status.get("phase") in (COMMITTED, RELEASED) and bool(status.get("installed"))


def decide(
    move: Move,
    status: dict[str, Any],
    policy: Policy,
    now: float,
    *,
    approved: bool,
    last: tuple[Call, Answer] | None = None,
    tries: int = 0,
) -> Next:
    """What to persist and call next for `move`, from its persisted `status` and (`last`) the
    call just made and its answer. `tries`: how many times in a row `last` failed
    transiently (for the retry delay)."""
    status = dict(status)
    status.setdefault("phase", PLANNED)
    if finished(status):
        return Next(status)
    if last is not None:
        status, outcome = _after(move, status, policy, now, *last)
        if outcome == "done":
            return Next(status)
        if outcome == "retry":
            return _retry(move, status, policy, now, last[0], tries)
    return _next(move, status, policy, now, approved)


def _step_of(status: dict[str, Any]) -> Step | None:
    phase = status["phase"]
    if phase == PREFETCHING:
        return "prefetch"
    if phase == PAUSED:
        return "pause"
    if phase == CATCHING_UP:
        return "catch-up"
    if phase == COMMITTED:
        return "release" if status.get("installed") else "commit"
    if phase == ROLLED_BACK:
        return ROLLBACK_STEPS[int(status.get("rollbackStep", 0))]
    return None


def _call(move: Move, step: Step) -> Call:
    base = f"/internal/partitions/{move.partition}"
    to = move.assignment(move.generation, move.after)
    back = move.assignment(move.rollback_generation, move.before)
    calls: dict[Step, Call] = {
        "prefetch": Call(step, move.target, "POST", f"{base}/prefetch", source_url=True),
        "pause": Call(step, move.source, "POST", f"{base}/pause", to),
        "catch-up": Call(step, move.target, "POST", f"{base}/catch-up", source_url=True),
        "commit": Call(step, move.target, "PUT", "/internal/ownership", to),
        "release": Call(step, move.source, "DELETE", base),
        "return": Call(step, move.source, "PUT", "/internal/ownership", back),
        "withdraw": Call(step, move.target, "PUT", "/internal/ownership", back),
        "retake": Call(step, move.source, "PUT", "/internal/ownership", back),
        "forget": Call(step, move.target, "DELETE", base),
    }
    return calls[step]


def _enter(status: dict[str, Any], phase: str, now: float, message: str) -> dict[str, Any]:
    """`status` in `phase` from `now` (the last step's transient failure forgotten)."""
    entered = {**status, "phase": phase, "phaseAt": times.iso(now), "message": message}
    entered["lastError"] = None
    return entered


def _paused_s(status: dict[str, Any], now: float) -> float:
    return now - (times.parse(status.get("pausedAt")) or now)


def _rollback(status: dict[str, Any], now: float, why: str) -> dict[str, Any]:
    rolled = _enter(status, ROLLED_BACK, now, f"rolling back: {why}")
    rolled["rollbackStep"] = 0
    return rolled


def _fail(status: dict[str, Any], now: float, why: str) -> dict[str, Any]:
    failed = _enter(status, FAILED, now, f"{why}; a person must look (see decision 0020)")
    failed["finishedAt"] = times.iso(now)
    return failed


def _next(move: Move, status: dict[str, Any], policy: Policy, now: float, approved: bool) -> Next:
    phase = status["phase"]
    if phase == PLANNED:
        if not approved:
            waiting = {**status, "message": f"waiting for the {APPROVED}=true annotation"}
            return Next(waiting)
        status = _enter(status, PREFETCHING, now, "prefetching on the target")
        # What its installs are made of, kept: a resume makes the very same bodies.
        status.update(startedAt=times.iso(now), before=list(move.before), replicas=move.replicas)
        return Next(status, _call(move, "prefetch"))
    if phase in (PAUSED, CATCHING_UP) and _paused_s(status, now) > policy.budget_s:
        late = _paused_s(status, now) * 1000
        why = f"the pause reached {late:.0f} ms, past its budget of {policy.budget_s * 1000:.0f}"
        return _next(move, _rollback(status, now, why), policy, now, approved)
    if phase == COMMITTED and status.get("installed"):
        release_at = times.parse(status.get("releaseAt")) or now
        if now < release_at:
            return Next(status)  # the source keeps its copy a while
    step = _step_of(status)
    assert step is not None, status
    return Next(status, _call(move, step))


def _retry(
    move: Move, status: dict[str, Any], policy: Policy, now: float, call: Call, tries: int
) -> Next:
    """The same step again after a transient failure, unless its phase ran out of time."""
    started = times.parse(status.get("phaseAt")) or now
    if status["phase"] in (PAUSED, CATCHING_UP) and _paused_s(status, now) > policy.budget_s:
        return _next(move, status, policy, now, approved=True)  # rolls back
    if now - started > policy.timeout_s:
        last = status.get("lastError", "")
        why = f"{call.step} did not succeed within {policy.timeout_s:g} s (last: {last})"
        return Next(_fail(status, now, why))
    delay = min(RETRY_S * 2 ** min(tries, 5), 5.0)
    if status["phase"] in (PAUSED, CATCHING_UP):
        delay = min(delay, policy.budget_s / 10)
    return Next(status, call, delay)


Outcome = Literal["done", "retry", "next"]
"""After an answer: nothing more runs ("done"), the same call again ("retry"), the next step."""


def _after(
    move: Move, status: dict[str, Any], policy: Policy, now: float, call: Call, answer: Answer
) -> tuple[dict[str, Any], Outcome]:
    """The status after `answer` to `call`, and what follows."""
    if answer.status != 200:
        if call.step == "catch-up" and answer.code == "PARTITION_SERVED":
            # The target restarted after the pause and took the partition up from the source's
            # publication of the generation (decision 0019's start), reading on from its
            # prefetched mark: its state was never compared. Give the partition back.
            why = "the target serves the partition before its catch-up (it restarted)"
            return _rollback(status, now, why), "next"
        if not _transient(answer):
            why = f"{call.step} on ordinal {call.on}: {answer.describe()}"
            return _fail(status, now, why), "done"
        return {**status, "lastError": f"{call.step}: {answer.describe()}"}, "retry"
    if call.step == "retake" and move.partition not in answer.body.get("serving", []):
        return {**status, "lastError": "retake: the source does not serve it yet"}, "retry"
    if call.step in ROLLBACK_STEPS:
        return _rolled(status, now)
    return _SUCCEEDED[call.step](move, status, policy, now, answer.body)


def _prefetched(
    move: Move, status: dict[str, Any], policy: Policy, now: float, body: dict[str, Any]
) -> tuple[dict[str, Any], Outcome]:
    status = _enter(status, PAUSED, now, "pausing the source")
    status["pausedAt"] = times.iso(now)
    return status, "next"


def _paused(
    move: Move, status: dict[str, Any], policy: Policy, now: float, body: dict[str, Any]
) -> tuple[dict[str, Any], Outcome]:
    status = _enter(status, CATCHING_UP, now, "catching up on the target")
    status.update(sourceDigest=str(body.get("digest", "")), mark=str(body.get("mark", "")))
    return status, "next"


def _caught_up(
    move: Move, status: dict[str, Any], policy: Policy, now: float, body: dict[str, Any]
) -> tuple[dict[str, Any], Outcome]:
    status = {**status, "targetDigest": str(body.get("digest", ""))}
    if status["targetDigest"] != status.get("sourceDigest"):
        return _rollback(status, now, "the target's digest differs from the source's"), "next"
    if _paused_s(status, now) > policy.budget_s:
        return status, "next"  # `_next` rolls it back
    committing = _enter(status, COMMITTED, now, "committing on the target")
    committing["catchUpMs"] = round(_paused_s(status, now) * 1000, 1)
    return committing, "next"


def _committed(
    move: Move, status: dict[str, Any], policy: Policy, now: float, body: dict[str, Any]
) -> tuple[dict[str, Any], Outcome]:
    if move.partition not in body.get("serving", []):
        # The target waits for the source's publication (`pending`): install again.
        return {**status, "lastError": "commit: the target does not serve it yet"}, "retry"
    status = _enter(status, COMMITTED, now, "committed; the source keeps its copy")
    status.update(
        installed=True,
        pauseMs=round(_paused_s(status, now) * 1000, 1),
        releaseAt=times.iso(now + policy.keep_s),
    )
    return status, "next"


def _released(
    move: Move, status: dict[str, Any], policy: Policy, now: float, body: dict[str, Any]
) -> tuple[dict[str, Any], Outcome]:
    status = _enter(status, RELEASED, now, "released: the source forgot its copy")
    status["finishedAt"] = times.iso(now)
    return status, "done"


def _rolled(status: dict[str, Any], now: float) -> tuple[dict[str, Any], Outcome]:
    """One rollback step done (`ROLLBACK_STEPS`)."""
    step = int(status.get("rollbackStep", 0)) + 1
    if step < len(ROLLBACK_STEPS):
        return {**status, "rollbackStep": step}, "next"
    done = {**status, "rollbackStep": step, "finishedAt": times.iso(now)}
    done["message"] = str(status["message"]).replace("rolling back", "rolled back", 1)
    return done, "done"


_SUCCEEDED = {
    "prefetch": _prefetched,
    "pause": _paused,
    "catch-up": _caught_up,
    "commit": _committed,
    "release": _released,
}


def _transient(answer: Answer) -> bool:
    """A failure the same call may get past later (no answer, 5xx, the listed codes)."""
    if answer.status is None or answer.status >= 500:
        return True
    return answer.code in TRANSIENT
