"""Quorum rounds: which replicas a write or read goes to, and when it is decided.

Writes (N, W): the write goes to every home replica believed reachable; when fewer than W are,
nothing is sent and the answer is UNAVAILABLE. Each unreachable home replica gets a hint on the
first reachable fallback (hinted handoff); a hint does not count towards W (a strict quorum:
R + W > N keeps its meaning, and the INDETERMINATE answer stays honest). The round is OK once W
replicas acknowledged (each after its fsync); once too few are left to reach W, or the time is
up, it is INDETERMINATE: the write was sent, some replicas may hold it, it may or may not
become visible.

Reads (N, R): sent to every reachable home replica, decided once R answered (merged) or once
too few are left (UNAVAILABLE). Replicas among the answers whose value differs from the merge
are stale: the coordinator repairs them before answering (blocking read repair), and late
answers after the decision in the background.

Invariants: a round's outcome never changes once decided except from "undecided"; an answer
from a site the round did not send to, or a second answer from one site, changes nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from relay_kv import crdt
from relay_kv.placement import Replicas


class Outcome(enum.Enum):
    OK = "ok"
    INDETERMINATE = "indeterminate"
    UNAVAILABLE = "unavailable"


class Unavailable(Exception):
    """Fewer than the quorum of home replicas are reachable: nothing was sent."""


@dataclass(frozen=True)
class WritePlan:
    targets: tuple[str, ...]
    """Home replicas the write is sent to."""
    hints: dict[str, str]
    """Unreachable home replica -> the fallback that keeps its hint."""


def fallback_for(replicas: Replicas, reachable: Collection[str]) -> str | None:
    """The first reachable fallback: where a hint for an unreachable home replica goes."""
    return next((site for site in replicas.fallback if site in reachable), None)


def plan_write(replicas: Replicas, reachable: Collection[str], w: int) -> WritePlan:
    targets = tuple(site for site in replicas.home if site in reachable)
    if len(targets) < w:
        raise Unavailable(
            f"{len(targets)} of {len(replicas.home)} replicas reachable, the write needs {w}"
        )
    hints: dict[str, str] = {}
    helper = fallback_for(replicas, reachable)
    if helper is not None:
        for site in replicas.home:
            if site not in reachable:
                hints[site] = helper
    return WritePlan(targets, hints)


def plan_read(replicas: Replicas, reachable: Collection[str], r: int) -> tuple[str, ...]:
    targets = tuple(site for site in replicas.home if site in reachable)
    if len(targets) < r:
        raise Unavailable(
            f"{len(targets)} of {len(replicas.home)} replicas reachable, the read needs {r}"
        )
    return targets


@dataclass
class WriteRound:
    targets: tuple[str, ...]
    w: int
    acked: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    def ack(self, site: str) -> None:
        if site in self.targets and site not in self.failed:
            self.acked.add(site)

    def fail(self, site: str) -> None:
        if site in self.targets and site not in self.acked:
            self.failed.add(site)

    @property
    def pending(self) -> int:
        return len(self.targets) - len(self.acked) - len(self.failed)

    @property
    def decided(self) -> Outcome | None:
        if len(self.acked) >= self.w:
            return Outcome.OK
        if len(self.acked) + self.pending < self.w:
            return Outcome.INDETERMINATE
        return None

    def final(self) -> Outcome:
        """The outcome when the time is up."""
        return self.decided or Outcome.INDETERMINATE


@dataclass
class ReadRound:
    targets: tuple[str, ...]
    r: int
    answers: dict[str, crdt.Value | None] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)

    def answer(self, site: str, value: crdt.Value | None) -> None:
        if site in self.targets and site not in self.failed and site not in self.answers:
            self.answers[site] = value

    def fail(self, site: str) -> None:
        if site in self.targets and site not in self.answers:
            self.failed.add(site)

    @property
    def pending(self) -> int:
        return len(self.targets) - len(self.answers) - len(self.failed)

    @property
    def decided(self) -> Outcome | None:
        if len(self.answers) >= self.r:
            return Outcome.OK
        if len(self.answers) + self.pending < self.r:
            return Outcome.UNAVAILABLE
        return None

    def merged(self) -> crdt.Value | None:
        return crdt.merge_all(self.answers.values())

    def stale(self) -> list[str]:
        """Sites whose answer lacks something the merge has (to be repaired)."""
        merged = self.merged()
        return sorted(site for site, value in self.answers.items() if value != merged)
