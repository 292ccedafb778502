"""The archive audit's rules: does the archive cover every offset Kafka still holds?

What Kafka holds is read by the audit job (Spark's Kafka connector, `relay_spark.audit`); this
module only judges it. An offset Kafka holds on an archived topic is, in its epoch's slot:
- *covered* by an archive file (whatever the file kept of it: records of kinds the archiver
  skips still count as covered, since files name the offsets they consumed);
- *pending*: at or past the slot's resume point (the archiver has not reached it yet: its lag);
- a *gap*: below the resume point and in no file (a range the archive skipped or lost).

Invariant: the verdict is `clean` only when there is no gap; pending offsets are reported, never
judged (the archiver's lag is `relayctl archive status`'s business), and uncovered ranges are
reported as whole ranges, split at the resume point.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

EXIT_CLEAN = 0
EXIT_GAPS = 2


@dataclass(frozen=True, order=True)
class Uncovered:
    """A run of consecutive offsets `first`..`last` (both included) of a topic's partition that
    Kafka holds and no archive file covers."""

    topic: str
    partition: int
    first: int
    last: int


@dataclass(frozen=True)
class Held:
    """What Kafka holds of one partition: offsets `first`..`last`, `count` records."""

    first: int
    last: int
    count: int


def judge(
    epoch: str,
    held: Mapping[tuple[str, int], Held],
    uncovered: Iterable[Uncovered],
    resume: Mapping[tuple[str, int], int],
) -> tuple[int, dict[str, Any]]:
    """The exit code and report of an audit of `epoch`: `held` per (topic, partition), the
    ranges no file covers, and each slot's resume point (absent: nothing archived yet, so
    everything is pending)."""
    gaps: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for u in sorted(uncovered):
        point = resume.get((u.topic, u.partition), 0)
        if u.first < point:
            gaps.append(_range(u, u.first, min(u.last, point - 1)))
        if u.last >= point:
            pending.append(_range(u, max(u.first, point), u.last))
    doc = {
        "epoch": epoch,
        "verdict": "gaps" if gaps else "clean",
        "held": [
            {"topic": t, "partition": p, "first": h.first, "last": h.last, "count": h.count}
            for (t, p), h in sorted(held.items())
        ],
        "gaps": gaps,
        "pending": pending,
        "counts": {
            "held": sum(h.count for h in held.values()),
            "gap_offsets": sum(g["count"] for g in gaps),
            "pending_offsets": sum(p["count"] for p in pending),
        },
    }
    return (EXIT_GAPS if gaps else EXIT_CLEAN), doc


def _range(u: Uncovered, first: int, last: int) -> dict[str, Any]:
    return {
        "topic": u.topic,
        "partition": u.partition,
        "first": first,
        "last": last,
        "count": last - first + 1,
    }
