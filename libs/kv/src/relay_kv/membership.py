"""A membership change of the replicators (a join or a leave) while it is under way: which
replica sets a key has, where its writes and reads go, and when the change may complete.

A change moves from the view every site uses (`old`) to the one asked for (`new`, a higher
version). While it is under way:
- a write goes to the home replicas of both views (dual writes) and is acknowledged only once
  W of the old home replicas AND W of the new ones have it; UNAVAILABLE (nothing sent) when
  either set has fewer than W reachable. Hints go to the old view's first reachable fallback
  for an unreachable home replica of either set;
- a read goes to the old home replicas only (the new ones may still be pulling);
- each site that enters a shard's home set pulls that shard (`incoming`) by merging it from a
  read quorum of the shard's old home replicas, after the change started.
The change ends in two steps (`Step`), because coordinators do not switch at one instant:
`PULLING` (dual writes, reads on the old set) becomes `READING_NEW` (dual writes, reads on the
new set) once every incoming shard of every site was pulled (`Change.pulled_all`); only when
every site is `READING_NEW` (`finished`) does each use `new` alone. While any coordinator may
still read the old set, every coordinator still writes both sets, so each acknowledged write
meets every read quorum in either step.

Why this keeps R + W > N across the switch: a write acknowledged before the change is on W of
the old home set, so a pull from a read quorum (N - W + 1) of that set sees it; a write
acknowledged during the change is on W of the new home set directly. After the switch, a read
of R new home replicas therefore meets every acknowledged write. Before it, reads use the old
set, which every write still reaches with W.

Invariants: pure functions of their arguments; a shard whose home set does not change is
planned exactly as `relay_kv.quorum` plans it without a change (same targets, same W).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from relay_kv import quorum
from relay_kv.placement import SHARDS, Replicas, View


class Step(enum.Enum):
    PULLING = "pulling"
    """Dual writes; reads on the old home replicas; joining sites pull their shards."""
    READING_NEW = "reading_new"
    """Dual writes; reads on the new home replicas (every incoming shard was pulled)."""


class BadChange(ValueError):
    """A change that cannot be started (not newer, no site, nothing changes)."""


class UnknownSites(BadChange):
    """Sites asked for that no replicator has (yet) announced."""


class TooFewSites(BadChange):
    """Fewer sites than the largest N of a namespace."""


class Report(enum.IntEnum):
    """How far one site is in a change, as it tells the others (only ever grows)."""

    INSTALLED = 1
    """It holds the change: its coordinator dual-writes."""
    PULLED = 2
    """It pulled every shard it enters (none for a site that enters none)."""
    READING_NEW = 3
    """Its coordinator reads the new home replicas."""
    DONE = 4
    """It finished the change: its view is the new one."""


@dataclass(frozen=True)
class Joint:
    """A shard's replica sets in both views."""

    old: Replicas
    new: Replicas

    @property
    def moving(self) -> bool:
        return set(self.old.home) != set(self.new.home)

    @property
    def home(self) -> tuple[str, ...]:
        """Every home replica of either view: the old ones first, then those only new."""
        return self.old.home + tuple(s for s in self.new.home if s not in self.old.home)


@dataclass(frozen=True)
class Change:
    old: View
    new: View
    step: Step = Step.PULLING

    @classmethod
    def start(cls, old: View, sites: Iterable[str], version: int) -> Change:
        """The change from `old` to the view of `sites` at `version` (`BadChange` otherwise)."""
        wanted = tuple(sorted(set(sites)))
        if not wanted:
            raise BadChange("a membership needs at least one site")
        if version <= old.version:
            raise BadChange(f"version {version} is not newer than {old.version}")
        if wanted == tuple(sorted(old.sites)):
            raise BadChange("the membership would not change")
        return cls(old, View(version, wanted))

    def replicas(self, shard: int, n: int) -> Joint:
        return Joint(self.old.replicas(shard, n), self.new.replicas(shard, n))

    def incoming(self, site: str, n: int, shards: Iterable[int] | None = None) -> list[int]:
        """The shards `site` must pull before the change completes: it is a home replica of
        them in `new` and was not in `old`."""
        return [
            shard
            for shard in (range(SHARDS) if shards is None else shards)
            if site in self.new.replicas(shard, n).home
            and site not in self.old.replicas(shard, n).home
        ]

    def pulled_all(
        self, n: int, pulled: Mapping[str, Collection[int]], shards: Iterable[int] | None = None
    ) -> bool:
        """Whether every site of `new` pulled every shard it is to pull (`pulled`: site -> the
        shards it pulled since the change started)."""
        wanted = list(range(SHARDS) if shards is None else shards)
        return all(
            set(self.incoming(site, n, wanted)) <= set(pulled.get(site, ()))
            for site in self.new.sites
        )

    def reading_new(self) -> Change:
        """The next step, once `pulled_all`: reads move to the new home replicas."""
        return replace(self, step=Step.READING_NEW)


def check_target(
    view: View, sites: Iterable[str], known: Collection[str], max_n: int
) -> tuple[str, ...]:
    """The sites a change is to end with, checked: each known (`UnknownSites`), at least one
    and at least `max_n` (the largest N of a namespace: `TooFewSites`)."""
    wanted = tuple(sorted(set(sites)))
    unknown = [s for s in wanted if s not in known and s not in view.sites]
    if unknown:
        raise UnknownSites(f"unknown replicator sites: {', '.join(unknown)}")
    if len(wanted) < max(max_n, 1):
        raise TooFewSites(
            f"{len(wanted)} sites, but a namespace has n={max_n}: at least {max(max_n, 1)} needed"
        )
    return wanted


def may_pull(reports: Mapping[str, Report], participants: Iterable[str]) -> bool:
    """Every participant holds the change (so every coordinator dual-writes from now on)."""
    return all(reports.get(s, 0) >= Report.INSTALLED for s in participants)


def may_read_new(
    change: Change, reports: Mapping[str, Report], forgotten: Collection[str] = ()
) -> bool:
    """Every site of the new view pulled its incoming shards (`Change.pulled_all`, as each
    site reports it), but a forgotten one (dead: it will never report, and holds nothing a
    read could need, because every write it missed reached W of the others or failed)."""
    return all(reports.get(s, 0) >= Report.PULLED for s in change.new.sites if s not in forgotten)


def all_read_new(reports: Mapping[str, Report], participants: Iterable[str]) -> bool:
    """Every participant reads the new set: the old one may be dropped (`finished`)."""
    return all(reports.get(s, 0) >= Report.READING_NEW for s in participants)


def removal(view: View, forgotten: Collection[str]) -> tuple[str, ...] | None:
    """The sites a change is to end with to drop the forgotten sites still in `view` (None:
    there are none, or no other site would be left)."""
    kept = tuple(s for s in view.sites if s not in forgotten)
    return kept if kept and len(kept) < len(view.sites) else None


def starter(view: View, forgotten: Collection[str]) -> str | None:
    """The one site that starts the `removal` change: the lowest live site of the view, so
    that every site that knows the same forgotten sites picks the same one."""
    return min((s for s in view.sites if s not in forgotten), default=None)


def majorities(joint: Joint) -> tuple[int, int]:
    """A majority of each view's home set (old, new): the R and W of a namespace whose quorums
    are majorities of the home replicas that exist (Relay's own), kept per view during a change
    so that R + W > the home set's size in each (one number for both would not be: with home
    sets of 3 and 4, 2 is a majority of the first only)."""
    return len(joint.old.home) // 2 + 1, len(joint.new.home) // 2 + 1


def pull_quorum(home: int) -> int:
    """How many of a shard's `home` old replicas a pull must merge: a read quorum against the
    default W (a majority), R = home - W + 1."""
    return max(1, home - (home // 2 + 1) + 1)


def encode_view(view: View) -> dict[str, object]:
    return {"version": view.version, "sites": list(view.sites)}


def decode_view(raw: Mapping[str, object]) -> View:
    version, sites = raw["version"], raw["sites"]
    if not isinstance(version, int) or not isinstance(sites, list):
        raise ValueError(f"not a view: {raw!r}")
    return View(version, tuple(sorted(str(s) for s in sites)))


def encode_change(change: Change) -> dict[str, object]:
    return {
        "old": encode_view(change.old),
        "new": encode_view(change.new),
        "step": change.step.value,
    }


def decode_change(raw: Mapping[str, object]) -> Change:
    old, new, step = raw["old"], raw["new"], raw.get("step", Step.PULLING.value)
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        raise ValueError(f"not a change: {raw!r}")
    change = Change(decode_view(old), decode_view(new), Step(step))
    if change.new.version <= change.old.version:
        raise ValueError(f"not a change: {raw!r}")
    return change


def finished(steps: Mapping[str, Step], sites: Iterable[str]) -> bool:
    """Whether every site (each coordinator of the new view) reads the new set: only then may
    writes stop going to the old one."""
    return all(steps.get(site) is Step.READING_NEW for site in sites)


def plan_write(
    joint: Joint, reachable: Collection[str], w: int, w_new: int | None = None
) -> quorum.WritePlan:
    """Where a write goes during a change: every reachable home replica of both views, once
    each view has W of them (`w_new` for the new view when its W differs: a majority of home
    sets of different sizes); `quorum.Unavailable` otherwise; hints for the unreachable ones on
    the old view's first reachable fallback that is not itself a target."""
    old = quorum.plan_write(joint.old, reachable, w)
    new = quorum.plan_write(joint.new, reachable, w if w_new is None else w_new)
    targets = old.targets + tuple(s for s in new.targets if s not in old.targets)
    helper = next(
        (s for s in joint.old.fallback if s in reachable and s not in targets),
        None,
    )
    hints = {site: helper for site in joint.home if site not in reachable and helper is not None}
    return quorum.WritePlan(targets, hints)


def plan_read(
    joint: Joint, reachable: Collection[str], r: int, step: Step = Step.PULLING
) -> tuple[str, ...]:
    """Where a read goes during a change: the old home replicas while the new may be pulling,
    the new ones once every shard was pulled."""
    return quorum.plan_read(joint.new if step is Step.READING_NEW else joint.old, reachable, r)


@dataclass
class JointWriteRound:
    """A write round counted in both views: OK once each has W acknowledgements,
    INDETERMINATE once either can no longer reach W."""

    joint: Joint
    targets: tuple[str, ...]
    w: int
    w_new: int | None = None
    """The new view's W when it differs from the old's (`plan_write`)."""
    old: quorum.WriteRound = field(init=False)
    new: quorum.WriteRound = field(init=False)

    def __post_init__(self) -> None:
        self.old = quorum.WriteRound(
            tuple(s for s in self.targets if s in self.joint.old.home), self.w
        )
        self.new = quorum.WriteRound(
            tuple(s for s in self.targets if s in self.joint.new.home),
            self.w if self.w_new is None else self.w_new,
        )

    def ack(self, site: str) -> None:
        self.old.ack(site)
        self.new.ack(site)

    def fail(self, site: str) -> None:
        self.old.fail(site)
        self.new.fail(site)

    @property
    def decided(self) -> quorum.Outcome | None:
        outcomes = (self.old.decided, self.new.decided)
        if quorum.Outcome.INDETERMINATE in outcomes:
            return quorum.Outcome.INDETERMINATE
        if outcomes == (quorum.Outcome.OK, quorum.Outcome.OK):
            return quorum.Outcome.OK
        return None

    def final(self) -> quorum.Outcome:
        return self.decided or quorum.Outcome.INDETERMINATE
