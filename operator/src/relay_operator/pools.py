"""Partition ownership of a pool (queue-writers or retainers) and the moves a scale needs.

An assignment is a list: index = partition, value = the ordinal that owns it. The services hold
a fenced, generation-numbered one (decision 0019) and report it at `GET /internal/ownership`;
`adopted` takes the newest they report, `initial` (`p mod n`, their generation 1) when none
answers. `plan` is written for it.

Invariants of `plan(assignment, wanted)`: applying its moves leaves every partition owned by one
ordinal below `wanted`; the partitions per ordinal differ by at most one; a partition moves only
when its owner is being removed or owns more than its share, so a scale moves as few partitions
as balance allows (tested with hypothesis in tests/operator/test_rules.py). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relay_operator import conditions, times
from relay_operator.moves import RELEASED, ROLLED_BACK

SCALE_BLOCKED = "ScaleBlocked"
READY = "Ready"
MIGRATING = "Migrating"


@dataclass(frozen=True)
class Move:
    partition: int
    source: int
    target: int


def initial(partitions: int, replicas: int) -> list[int]:
    """The assignment services use before generations exist: partition p on ordinal p mod n."""
    return [p % replicas for p in range(partitions)]


def adopted(
    partitions: int, replicas: int, reported: list[dict[str, Any]]
) -> tuple[int, list[int]]:
    """The (generation, assignment) a pool adopts: the newest among its instances' answers to
    `GET /internal/ownership` (`reported`; instances that did not answer are left out), else
    generation 1 of `initial`. Two answers with the newest generation and different owners, or
    one for another partition count, raise ValueError: nothing is adopted until resolved."""
    found: dict[int, list[int]] = {}
    for answer in reported:
        record = answer.get("assignment")
        if not isinstance(record, dict):
            continue  # an instance still waiting for its first assignment
        generation, owners = int(record["generation"]), [int(o) for o in record["assignment"]]
        if len(owners) != partitions:
            raise ValueError(
                f"an instance reports {len(owners)} partitions, the cluster has {partitions}"
            )
        if found.get(generation, owners) != owners:
            raise ValueError(f"instances report generation {generation} with different owners")
        found[generation] = owners
    if not found:
        return 1, initial(partitions, replicas)
    newest = max(found)
    return newest, found[newest]


def plan(assignment: list[int], wanted: int) -> list[Move]:
    """The moves that take `assignment` to `wanted` ordinals, balanced; in partition order."""
    if wanted < 1:
        raise ValueError("a pool needs at least one instance")
    partitions = len(assignment)
    owned: dict[int, list[int]] = {k: [] for k in range(wanted)}
    homeless: list[int] = []
    for partition, owner in enumerate(assignment):
        (owned[owner] if owner < wanted else homeless).append(partition)
    base, extra = divmod(partitions, wanted)
    # The ordinals that already hold the most keep the extra partitions: fewer moves.
    by_load = sorted(owned, key=lambda k: (-len(owned[k]), k))
    share = {k: base + (1 if rank < extra else 0) for rank, k in enumerate(by_load)}
    for k in range(wanted):
        while len(owned[k]) > share[k]:
            homeless.append(owned[k].pop())
    homeless.sort()
    moves: list[Move] = []
    for partition in homeless:
        target = min((k for k in range(wanted) if len(owned[k]) < share[k]), key=lambda k: k)
        owned[target].append(partition)
        moves.append(Move(partition, assignment[partition], target))
    return sorted(moves, key=lambda m: m.partition)


def apply(assignment: list[int], moves: list[Move]) -> list[int]:
    result = list(assignment)
    for move in moves:
        if result[move.partition] != move.source:
            raise ValueError(f"partition {move.partition} is not on ordinal {move.source}")
        result[move.partition] = move.target
    return result


def schedule(generation: int, moves: list[Move], shrinking: bool) -> list[tuple[int, Move]]:
    """The moves of one plan in the order they run, each with its generation: scale up in
    partition order; scale down empties the highest ordinal first. Move i gets generation
    `generation + 2i + 1`; `generation + 2i + 2` stays free for its rollback (one newer,
    giving the partition back), so no two installs of a plan share a generation."""
    key = (lambda m: (-m.source, m.partition)) if shrinking else (lambda m: m.partition)
    return [(generation + 2 * i + 1, m) for i, m in enumerate(sorted(moves, key=key))]


def address(pod: dict[str, Any], port: int) -> str | None:
    """The URL of a pool instance from its Pod: `http://<status.podIP>:<port>` when the Pod is
    Ready and has an IP, else None (it cannot take part in a move yet)."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    ready = conditions.find(status.get("conditions"), "Ready") or {}
    if not ip or ready.get("status") != "True" or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def move_name(pool: str, generation: int, move: Move) -> str:
    """One name per (pool, generation, partition): creating it twice is a no-op (409)."""
    return f"{pool}-g{generation}-p{move.partition}"


def move_spec(pool: str, generation: int, move: Move) -> dict[str, Any]:
    """The RelayPartitionMove spec of `move` (what the CRD holds, immutable once created)."""
    return {
        "pool": pool,
        "partition": move.partition,
        "fromOrdinal": move.source,
        "toOrdinal": move.target,
        "generation": generation,
    }


def superseded(existing: list[dict[str, Any]], pool: str, planned: dict[str, Any]) -> list[str]:
    """Names of this pool's RelayPartitionMoves still in Planned that the current plan (`planned`:
    name → spec) does not hold as they are (the scale they were planned for changed or was
    withdrawn): they are dropped and planned again. A move that started is never touched here."""
    return sorted(
        m["metadata"]["name"]
        for m in existing
        if m.get("spec", {}).get("pool") == pool
        and (m.get("status") or {}).get("phase", "Planned") == "Planned"
        and planned.get(m["metadata"]["name"]) != m.get("spec")
    )


def expired(
    existing: list[dict[str, Any]], generation: int, now: float, keep_s: float
) -> list[str]:
    """Names of RelayPartitionMoves to delete: Released or RolledBack (their steps done) more
    than `keep_s` before `now`, and already counted in the pool's status at `generation` (a
    released move's generation, a rolled-back one's plus one; until then the pool's catch-up
    still reads them). Failed moves are a person's to delete; running ones are never touched."""
    old = []
    for move in existing:
        status = move.get("status") or {}
        finished_at = times.parse(status.get("finishedAt"))
        phase = status.get("phase")
        if finished_at is None or phase not in (RELEASED, ROLLED_BACK):
            continue
        counted = int(move["spec"]["generation"]) + (phase == ROLLED_BACK) <= generation
        if counted and now - finished_at > keep_s:
            old.append(str(move["metadata"]["name"]))
    return sorted(old)


def restore_replicas(held: int | None, actual: int | None) -> int | None:
    """The StatefulSet's replica count to put back after someone edited it directly, or None
    when it already matches the owners in force (or the pool has not adopted it yet)."""
    if held is None or actual is None or held == actual:
        return None
    return held


def readiness(states: list[dict[str, Any]]) -> conditions.Condition:
    """Ready: every pool has adopted its StatefulSet and all its owners in force are ready
    (`states`: the pools' `held` owners and `ready` pods, as the operator indexes them)."""
    if not states:
        return conditions.Condition(READY, "False", "NoPools", "no RelayPool in this namespace")
    short = [
        f"{s['pool']}: {s.get('ready') or 0}/{s['held']} ready"
        for s in states
        if s.get("held") is None or (s.get("ready") or 0) < s["held"]
    ]
    if short:
        return conditions.Condition(READY, "False", "OwnersNotReady", "; ".join(short))
    return conditions.Condition(READY, "True", "OwnersReady", "every pool's owners are ready")


def migrating(active: str | None = None, reason: str = "MoveRunning") -> conditions.Condition:
    """Migrating: True while a scale runs its moves (`active` says what it does now)."""
    if active is None:
        return conditions.Condition(MIGRATING, "False", "Idle", "no partition move runs")
    return conditions.Condition(MIGRATING, "True", reason, active)
