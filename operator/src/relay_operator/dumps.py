"""When the next store-log dump is due, and what a dump's answer means for the status.

The due time is computed from the status alone (`status.dumps`), never from when the operator
process started: kopf fires a timer at once after a restart, and a due time kept in memory would
be lost then. So a restarted operator does not dump early, and a stopped one dumps once when it
comes back, however long it was away.

Invariant: `due_at` is `lastAttemptAt + interval` after a successful attempt and
`lastAttemptAt + retry` after a failed one (never later than the interval); with no attempt
recorded the first dump is due at once; an interval of 0 means the operator never dumps. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from relay_operator import conditions, times

DUMPS_HEALTHY = "DumpsHealthy"


@dataclass(frozen=True)
class Policy:
    interval_s: float
    """Seconds between dumps (RelayCluster `spec.dumpIntervalSeconds`); 0: no dumps."""
    timeout_s: float
    """How long one dump may take (`spec.dumpTimeoutSeconds`)."""
    retry_s: float
    """Wait after a failed attempt (capped by the interval)."""


@dataclass(frozen=True)
class Writer:
    """One queue-writer's figures, as `POST /admin/dump?wait=true` reports them."""

    instance: str
    partitions: list[int]
    dump: int
    records: int | None = None
    bytes: int | None = None
    pause_ms: float | None = None
    total_s: float | None = None

    def status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "instance": self.instance,
            "partitions": self.partitions,
            "dump": self.dump,
        }
        figures = {
            "records": self.records,
            "bytes": self.bytes,
            "pauseMs": self.pause_ms,
            "totalSeconds": self.total_s,
        }
        entry.update({k: v for k, v in figures.items() if v is not None})
        return entry


@dataclass(frozen=True)
class Outcome:
    """What one dump attempt came to."""

    ok: bool
    dump: int | None = None
    writers: list[Writer] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    """Command partitions whose queue-writer did not answer (a 503 names them)."""
    error: str = ""
    """The failure in words (the answer's status and detail, or why none came)."""


def due_at(record: dict[str, Any] | None, policy: Policy) -> float | None:
    """Unix seconds at which the next dump is due; None when dumps are off."""
    if policy.interval_s <= 0:
        return None
    record = record or {}
    last = times.parse(record.get("lastAttemptAt"))
    if last is None:
        return 0.0
    failed = int(record.get("failures", 0)) > 0
    return last + (min(policy.retry_s, policy.interval_s) if failed else policy.interval_s)


def is_due(record: dict[str, Any] | None, policy: Policy, now: float) -> bool:
    due = due_at(record, policy)
    return due is not None and now >= due


_MISSING = re.compile(r"partitions \[([0-9, ]*)\]")


def missing_partitions(detail: str) -> list[int]:
    """The partitions the ingress names in its 503 detail ("... for command partitions [1, 3]
    (is every queue-writer running?)"); empty when it names none."""
    found = _MISSING.search(detail)
    if found is None:
        return []
    return [int(p) for p in found.group(1).replace(" ", "").split(",") if p]


def from_answer(status: int, body: dict[str, Any]) -> Outcome:
    """The outcome of `POST /admin/dump?wait=true` answered with `status` and JSON `body`."""
    if status == 200:
        writers = [
            Writer(
                instance=w["instance"],
                partitions=list(w["partitions"]),
                dump=int(w["dump"]),
                records=w.get("records"),
                bytes=w.get("bytes"),
                pause_ms=w.get("pause_ms"),
                total_s=w.get("total_s"),
            )
            for w in body.get("writers", [])
        ]
        return Outcome(ok=True, dump=body.get("dump"), writers=writers)
    detail = str(body.get("detail", body))
    missing = missing_partitions(detail) if status == 503 else []
    return Outcome(ok=False, missing=missing, error=f"{status} {body.get('error', '')}: {detail}")


def record(previous: dict[str, Any] | None, outcome: Outcome, started: float) -> dict[str, Any]:
    """The new `status.dumps` after an attempt that started at `started`."""
    previous = previous or {}
    new: dict[str, Any] = {"lastAttemptAt": times.iso(started)}
    if outcome.ok:
        new.update(
            lastSuccessAt=times.iso(started),
            dump=outcome.dump,
            failures=0,
            missingPartitions=[],
            writers=[w.status() for w in outcome.writers],
        )
    else:
        new.update(
            lastSuccessAt=previous.get("lastSuccessAt"),
            dump=previous.get("dump"),
            failures=int(previous.get("failures", 0)) + 1,
            missingPartitions=outcome.missing,
            writers=previous.get("writers", []),
        )
    return {k: v for k, v in new.items() if v is not None}


def condition(outcome: Outcome, policy: Policy) -> conditions.Condition:
    """DumpsHealthy after an attempt: False names the partitions that did not answer."""
    if outcome.ok:
        pauses = [w.pause_ms for w in outcome.writers if w.pause_ms is not None]
        longest = f", longest pause {max(pauses):.1f} ms" if pauses else ""
        return conditions.Condition(
            DUMPS_HEALTHY,
            "True",
            "Dumped",
            f"dump {outcome.dump} finished on {len(outcome.writers)} queue-writer(s){longest}",
        )
    if outcome.missing:
        return conditions.Condition(
            DUMPS_HEALTHY,
            "False",
            "PartitionsSilent",
            f"command partitions {outcome.missing} did not answer the dump within "
            f"{policy.timeout_s:g} s: their queue-writer is down or stuck ({outcome.error})",
        )
    return conditions.Condition(DUMPS_HEALTHY, "False", "DumpFailed", outcome.error)
