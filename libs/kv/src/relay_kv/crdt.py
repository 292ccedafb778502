"""The replicated values and their merge: state-based CRDTs.

- `Register`: last writer wins by `Version` (hybrid logical clock, site tie-break). A delete or
  an expiry is a register whose value is `None` (a tombstone): invisible to clients, merged
  like any other write.
- `AWSet`: an add-wins observed-remove set without tombstones per element (Riak's ORSWOT):
  `clock` is a version vector (site -> highest dot counter seen), each member keeps the dots
  of the adds that put it there. A remove drops the member's observed dots; the clock still
  covers them, so a replica that has not seen the remove drops them on merge. An add that the
  remover had not observed carries a dot the remover's clock does not cover and survives:
  concurrent add and remove, add wins.
- `KvMap`: field -> `Register`, merged field by field.

Invariants (checked by `tests/kv/test_crdt_laws.py` with hypothesis):
- `merge` is commutative, associative and idempotent for every pair of values, whatever their
  types: values of different types merge by a fixed rank (register < set < map), so the merge
  is the join of a lattice (the coordinator refuses to change the type of a live value);
- `merge` never loses a dot that the other side's clock does not cover (no acknowledged add
  lost) and never invents a member (every member comes from an add);
- values are immutable; every operation returns a new value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from relay_kv.clock import ZERO, Version

Dot = tuple[str, int]
"""(site, counter): one add's identity."""


def _later_expiry(a: int | None, b: int | None) -> int | None:
    """The same dot always carries one expiry; should two ever differ, the later one (None =
    never) is kept, which is commutative, associative and idempotent."""
    if a is None or b is None:
        return None
    return max(a, b)


@dataclass(frozen=True)
class Register:
    version: Version
    value: bytes | None
    """None: a tombstone (deleted)."""
    expires_at: int | None = None
    """Unix ms after which the value reads as absent (an expiry is a tombstone too)."""

    RANK = 0

    def _order(self) -> tuple[Version, bool, bytes, int]:
        # Equal versions come from one write and carry one value; ordering the rest of the
        # fields too keeps the merge a total function even if they ever did not.
        return (
            self.version,
            self.value is not None,
            self.value or b"",
            -1 if self.expires_at is None else self.expires_at,
        )

    def merge(self, other: Register) -> Register:
        return self if self._order() >= other._order() else other

    def visible(self, now_ms: int) -> bytes | None:
        if self.value is None or (self.expires_at is not None and self.expires_at <= now_ms):
            return None
        return self.value

    @property
    def updated(self) -> Version:
        return self.version


@dataclass(frozen=True)
class AWSet:
    clock: Mapping[str, int] = field(default_factory=dict)
    entries: Mapping[bytes, Mapping[Dot, int | None]] = field(default_factory=dict)
    """member -> {dot: expires_at (Unix ms) or None}."""
    updated: Version = ZERO
    """The latest operation's version (the version answered; tombstone age for GC)."""

    RANK = 1

    def covers(self, dot: Dot) -> bool:
        return dot[1] <= self.clock.get(dot[0], 0)

    def merge(self, other: AWSet) -> AWSet:
        clock = {
            site: max(self.clock.get(site, 0), other.clock.get(site, 0))
            for site in self.clock.keys() | other.clock.keys()
        }
        entries: dict[bytes, dict[Dot, int | None]] = {}
        for member in self.entries.keys() | other.entries.keys():
            mine = self.entries.get(member, {})
            theirs = other.entries.get(member, {})
            kept: dict[Dot, int | None] = {}
            for dot, expiry in mine.items():
                if dot in theirs:
                    kept[dot] = _later_expiry(expiry, theirs[dot])
                elif not other.covers(dot):
                    kept[dot] = expiry
            for dot, expiry in theirs.items():
                if dot not in mine and not self.covers(dot):
                    kept[dot] = expiry
            if kept:
                entries[member] = kept
        return AWSet(clock, entries, max(self.updated, other.updated))

    def add(
        self, members: Iterable[bytes], version: Version, expires_at: int | None = None
    ) -> AWSet:
        """Add `members` with one new dot of `version.site`, replacing the dots observed for
        them. The dot's counter is past every counter of that site this state has seen."""
        counter = max(version.as_int(), self.clock.get(version.site, 0) + 1)
        dot: Dot = (version.site, counter)
        entries = dict(self.entries)
        for member in members:
            entries[member] = {dot: expires_at}
        clock = {**self.clock, version.site: counter}
        return AWSet(clock, entries, max(self.updated, version))

    def remove(self, members: Iterable[bytes], version: Version) -> AWSet:
        """Drop the observed adds of `members` (a member not present is left alone: only what
        was observed can be removed)."""
        entries = dict(self.entries)
        for member in members:
            entries.pop(member, None)
        return AWSet(self.clock, entries, max(self.updated, version))

    def only(self, member: bytes) -> AWSet:
        """This state as seen by one member: the same clock, that member's dots alone (what a
        set stored as rows keeps in the member's row, `relay_kv.setrows`)."""
        dots = self.entries.get(member)
        return AWSet(self.clock, {} if dots is None else {member: dots}, self.updated)

    def members(self, now_ms: int) -> list[bytes]:
        """The members visible at `now_ms`, in byte order."""
        return sorted(
            member
            for member, dots in self.entries.items()
            if any(expiry is None or expiry > now_ms for expiry in dots.values())
        )

    def expire(self, now_ms: int) -> AWSet:
        """Drop dots whose expiry has passed (deterministic on every replica)."""
        entries = {
            member: kept
            for member, dots in self.entries.items()
            if (kept := {d: e for d, e in dots.items() if e is None or e > now_ms})
        }
        return AWSet(self.clock, entries, self.updated)


@dataclass(frozen=True)
class KvMap:
    fields: Mapping[str, Register] = field(default_factory=dict)

    RANK = 2

    def merge(self, other: KvMap) -> KvMap:
        merged = dict(self.fields)
        for name, register in other.fields.items():
            mine = merged.get(name)
            merged[name] = register if mine is None else mine.merge(register)
        return KvMap(merged)

    def put(self, name: str, register: Register) -> KvMap:
        mine = self.fields.get(name)
        return KvMap({**self.fields, name: register if mine is None else mine.merge(register)})

    def visible(self, now_ms: int) -> dict[str, Register]:
        return {
            name: register
            for name, register in sorted(self.fields.items())
            if register.visible(now_ms) is not None
        }

    @property
    def updated(self) -> Version:
        return max((r.version for r in self.fields.values()), default=ZERO)


Value = Register | AWSet | KvMap


def merge(a: Value, b: Value) -> Value:
    """The join of two values of any types (see the module's invariants)."""
    if isinstance(a, Register) and isinstance(b, Register):
        return a.merge(b)
    if isinstance(a, AWSet) and isinstance(b, AWSet):
        return a.merge(b)
    if isinstance(a, KvMap) and isinstance(b, KvMap):
        return a.merge(b)
    return a if a.RANK > b.RANK else b


def merge_all(values: Iterable[Value | None]) -> Value | None:
    merged: Value | None = None
    for value in values:
        if value is not None:
            merged = value if merged is None else merge(merged, value)
    return merged


def is_live(value: Value | None, now_ms: int) -> bool:
    """Whether a client would see anything of `value`."""
    if value is None:
        return False
    if isinstance(value, Register):
        return value.visible(now_ms) is not None
    if isinstance(value, AWSet):
        return bool(value.members(now_ms))
    return bool(value.visible(now_ms))


def newer_than(stored: Value | None, incoming: Value) -> Version | None:
    """For last-writer-wins values: the stored version that beats `incoming`'s, if any.

    A replica answers it so that the coordinator advances its clock past it and writes again:
    a write that starts after another was acknowledged then always wins, even from a site
    whose clock is behind. Sets merge by causality, not by time: never "newer"."""
    if isinstance(stored, Register) and isinstance(incoming, Register):
        return stored.version if stored.version > incoming.version else None
    if isinstance(stored, KvMap) and isinstance(incoming, KvMap):
        beaten = [
            stored.fields[name].version
            for name, register in incoming.fields.items()
            if name in stored.fields and stored.fields[name].version > register.version
        ]
        return max(beaten, default=None)
    return None
