"""The generation-numbered partition assignment of a pool of stateful instances, and its rules.

An assignment is `{generation, partitions, replicas, owners}`: `owners[p]` is the ordinal that
owns partition p. Pure: no I/O, no clock.

Invariants:
- a valid assignment gives every partition exactly one owner, an ordinal below `replicas`;
- between two assignments the newer generation wins; an older one is `STALE` and the same
  generation with other owners is a `CONFLICT`: both are refused and change nothing;
- fencing (`serving`): an instance serves partition p only when p is its own under the newest
  generation it accepted, and no other instance's last published acceptance that differs from
  that one gives p to that instance. Every
  instance publishes what it accepted after it stopped serving what that removes and before it
  starts anything it adds, so two instances can never serve one partition at once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 2


class InvalidAssignment(ValueError):
    """A record that is not a valid assignment; `code` is the machine-readable reason."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class Assignment:
    generation: int
    replicas: int
    owners: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.owners)

    def owned(self, ordinal: int) -> list[int]:
        """The partitions `ordinal` owns, in order (empty for an ordinal that owns nothing)."""
        return [p for p, owner in enumerate(self.owners) if owner == ordinal]

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "partitions": self.partitions,
            "replicas": self.replicas,
            "assignment": list(self.owners),
        }


def initial(partitions: int, replicas: int, generation: int = 1) -> Assignment:
    """The split before generations existed: partition p on ordinal p mod n."""
    return validate(
        Assignment(generation, replicas, tuple(p % replicas for p in range(partitions)))
    )


def validate(assignment: Assignment, partitions: int | None = None) -> Assignment:
    """`assignment` if it is valid (for a topic of `partitions`, when given), else raise."""
    if assignment.generation < 1:
        raise InvalidAssignment("BAD_GENERATION", "generation must be at least 1")
    if assignment.replicas < 1:
        raise InvalidAssignment("BAD_REPLICAS", "replicas must be at least 1")
    if assignment.partitions < 1:
        raise InvalidAssignment("BAD_PARTITIONS", "an assignment needs at least one partition")
    if partitions is not None and assignment.partitions != partitions:
        raise InvalidAssignment(
            "PARTITIONS_MISMATCH",
            f"the assignment covers {assignment.partitions} partitions, the topic has {partitions}",
        )
    stray = sorted({o for o in assignment.owners if not 0 <= o < assignment.replicas})
    if stray:
        raise InvalidAssignment(
            "BAD_OWNER",
            f"owners {stray} are not ordinals below replicas ({assignment.replicas})",
        )
    return assignment


def parse(record: Mapping[str, Any], partitions: int | None = None) -> Assignment:
    """An assignment from its JSON form (`to_json`), validated; `partitions`, when present in
    the record, must match the length of `assignment`."""
    try:
        generation, replicas, owners = (
            record["generation"],
            record["replicas"],
            record["assignment"],
        )
    except (KeyError, TypeError):
        raise InvalidAssignment(
            "BAD_ASSIGNMENT", "an assignment needs generation, replicas and assignment"
        ) from None
    if not (
        _is_int(generation)
        and _is_int(replicas)
        and isinstance(owners, list)
        and all(_is_int(o) for o in owners)
    ):
        raise InvalidAssignment(
            "BAD_ASSIGNMENT", "generation and replicas are integers, assignment a list of them"
        )
    if "partitions" in record and record["partitions"] != len(owners):
        raise InvalidAssignment(
            "BAD_ASSIGNMENT",
            f"partitions is {record['partitions']!r} but assignment lists {len(owners)} owners",
        )
    return validate(Assignment(generation, replicas, tuple(owners)), partitions)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def from_v1(record: Mapping[str, Any], partitions: int) -> Assignment:
    """A version 1 `ownership.json` ({service, ordinal, replicas}: p mod n) as generation 1."""
    replicas = record.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise InvalidAssignment("BAD_ASSIGNMENT", f"version 1 record has replicas {replicas!r}")
    return initial(partitions, replicas, generation=1)


class Verdict(enum.Enum):
    NEWER = "newer"
    SAME = "same"
    STALE = "stale"
    CONFLICT = "conflict"


def compare(current: Assignment | None, offered: Assignment) -> Verdict:
    """How `offered` relates to the assignment in force (`None`: none yet, so it is newer)."""
    if current is None or offered.generation > current.generation:
        return Verdict.NEWER
    if offered.generation < current.generation:
        return Verdict.STALE
    return Verdict.SAME if offered == current else Verdict.CONFLICT


def newest(*candidates: Assignment | None) -> Assignment | None:
    """The newest of `candidates` (None ones ignored); raise `InvalidAssignment` with code
    `CONFLICT` when two of the newest generation disagree."""
    known = [c for c in candidates if c is not None]
    if not known:
        return None
    top = max(c.generation for c in known)
    tops = {c for c in known if c.generation == top}
    if len(tops) > 1:
        raise InvalidAssignment(
            "CONFLICT", f"generation {top} is recorded with {len(tops)} different assignments"
        )
    return tops.pop()


def serving(ordinal: int, accepted: Assignment, published: Mapping[int, Assignment]) -> list[int]:
    """The partitions `ordinal` may serve under `accepted`: its own there, less any partition
    that another ordinal's last published acceptance (`published`: ordinal → assignment), if
    it is not `accepted` itself, gives to that ordinal (it may be serving it: under an older
    generation it has not left, a newer one we have not been told, or a conflicting one). An
    ordinal with nothing published serves nothing (it publishes before serving)."""
    blocked: set[int] = set()
    for other, theirs in published.items():
        if other == ordinal:
            continue
        if theirs != accepted:
            blocked.update(theirs.owned(other))
    return [p for p in accepted.owned(ordinal) if p not in blocked]


def gained_while_down(ordinal: int, recorded: Assignment | None, newest: Assignment) -> list[int]:
    """The partitions an instance starting with `newest` (taken from another instance's
    publication) would take up though its own record (`recorded`, older) did not give them to
    it: it was told nothing, so it has not been brought up to date for them (a hand-off's
    target restarted between the source's pause and its own commit would serve the partition
    from its prefetched copy). They are withheld until an install tells it. An instance with
    no record (a new or emptied volume) withholds nothing."""
    if recorded is None or newest.generation <= recorded.generation:
        return []
    return [p for p in newest.owned(ordinal) if recorded.owners[p] != ordinal]
