"""Every retainer's description merged into one view of the durable storage, and the rules a
replica-set or site change must pass against it before any retainer is asked to apply it.

Merged: a site is known when some retainer knows it (the node a live retainer gives for itself
wins over what others registered); it is `up` when a live retainer is that site; a storage's
shards are every retainer's, in id order. A storage's replica-set target is its replicated
record (`relay_ds.targets`, read with a quorum and given as `stored`) when it has one: every
shard's transitions are then computed against it, whatever a retainer that has not applied it
yet says. A storage without a record (not written through `/ds` since the record exists) keeps
the retainers' own targets: its replica set is their union.

Invariants:
- a change is checked here first and refused as a whole (`Refused`: a bad or unknown site, a
  replica set too small, a live site or one in a replica set to forget; `Unknown`: no such
  storage or site), so a refused change reaches no retainer and changes nothing;
- the view only reads the descriptions: asking twice gives the same answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from relay_ds.errors import Refused, Unknown
from relay_ds.info import (
    JOINING,
    LEAVING,
    Description,
    DsInfo,
    Retainer,
    Shard,
    Site,
    SiteShard,
    SiteSummary,
    Storage,
    StorageShare,
    Transition,
)
from relay_ds.sites import SiteId, check_known, parse_site


class View:
    """Every retainer's description, merged. At least one description (every partition has an
    owner that answered)."""

    def __init__(
        self,
        descriptions: Iterable[Description],
        stored: Mapping[str, Sequence[SiteId]] | None = None,
    ) -> None:
        self.retainers = sorted(descriptions, key=lambda d: d.partitions[0])
        """Lowest partition first: the first is the retainer owning partition 0."""
        self.live = {d.site: d for d in self.retainers}
        self.known: dict[SiteId, str] = {}
        """Every known site and its node."""
        for d in self.retainers:
            for entry in d.sites:
                self.known.setdefault(entry.site, entry.node)
        for site, d in self.live.items():
            self.known[site] = d.node
        self.stored = {name: list(target) for name, target in (stored or {}).items()}
        """Each storage's replicated target (its record), for the storages that have one."""

    # -- what `/ds` shows ---------------------------------------------------------------------

    def storage_names(self) -> list[str]:
        return sorted({s.name for d in self.retainers for s in d.storages})

    def _shares(self, name: str) -> list[StorageShare]:
        shares = [s for d in self.retainers for s in d.storages if s.name == name]
        if not shares:
            raise Unknown(f"unknown storage {name!r}")
        return shares

    def storage(self, name: str) -> Storage:
        """The storage's shards from every retainer, in id order (`Unknown` if none has it)."""
        shards = [shard for share in self._shares(name) for shard in share.shards]
        shards.sort(key=lambda shard: int(shard.id))
        target = self.stored.get(name)
        if target is not None:
            shards = [replace(shard, transitions=_transitions(shard, target)) for shard in shards]
        return Storage(name=name, shards=shards)

    def targets(self, name: str) -> list[list[SiteId]]:
        """The storage's replica-set targets (`Unknown` if no retainer has it): its record's
        alone when it has one, else each retainer's own."""
        shares = self._shares(name)
        if name in self.stored:
            return [list(self.stored[name])]
        return [list(share.replicas) for share in shares]

    def replicas(self, name: str) -> list[SiteId]:
        """The sites the storage's replica set names: its record's, or the union over
        retainers while it has none."""
        return sorted({site for target in self.targets(name) for site in target})

    def target(self, name: str) -> list[SiteId]:
        """The one target a change starts from: the record's, or the union while there is
        none (`Unknown` if no retainer has the storage)."""
        targets = self.targets(name)
        return list(targets[0]) if len(targets) == 1 else self.replicas(name)

    def site(self, site: SiteId) -> Site:
        """A known site and the shards it holds or is to hold (`Unknown` if not known)."""
        if site not in self.known:
            raise Unknown(f"unknown site {site}")
        held: list[SiteShard] = []
        for name in self.storage_names():
            for shard in self.storage(name).shards:
                status = next((r.status for r in shard.replicas if r.site == site), None)
                transition = next((t.transition for t in shard.transitions if t.site == site), None)
                if status is not None or transition is not None:
                    held.append(SiteShard(name, shard.id, status, transition))
        return Site(node=self.known[site], up=site in self.live, shards=held)

    def summaries(self) -> list[SiteSummary]:
        return [
            SiteSummary(site=site, node=node, up=site in self.live)
            for site, node in sorted(self.known.items())
        ]

    def info(self) -> DsInfo:
        """Everything `relayctl ds info` prints."""
        return DsInfo(
            this_site=self.retainers[0].site,
            sites=self.summaries(),
            storages=[self.storage(name) for name in self.storage_names()],
            retainers=[Retainer(d.node, d.site, list(d.partitions)) for d in self.retainers],
        )

    # -- the rules of changes -----------------------------------------------------------------

    def known_site(self, text: str) -> SiteId:
        """The site `text` names, known to some retainer (`Refused` if malformed, `Unknown` if
        not known)."""
        site = parse_site(text)
        if site not in self.known:
            raise Unknown(f"unknown site {site}")
        return site

    def check_target(self, name: str, target: Sequence[SiteId]) -> None:
        """A new target (already `parse_target`ed) for an existing storage: every site known."""
        self.targets(name)
        check_known(target, self.known)

    def joining(self, name: str, text: str) -> SiteId:
        """The site to add to an existing storage's replica set: a known one (unknown is
        `Refused`, as a replica set naming an unknown site is)."""
        self.targets(name)
        site = parse_site(text)
        if site not in self.known:
            raise Refused(f"unknown site {site}")
        return site

    def check_leaving(self, name: str, site: SiteId) -> None:
        """The site may leave the storage's replica set: it is in it (`Unknown` if not) and is
        not the only site of any retainer's share (`Refused`)."""
        targets = self.targets(name)
        if not any(site in target for target in targets):
            raise Unknown(f"site {site} is not part of the replica set")
        if any(target == [site] for target in targets):
            raise Refused(f"replica set too small: {site} is the only site of a share")

    def forgettable(self, text: str) -> SiteId:
        """The site to forget: known, gone (no live retainer is it) and in no storage's replica
        set, neither holding a shard nor in a target."""
        site = self.known_site(text)
        if site in self.live:
            raise Refused(
                f"site {site} is up ({self.live[site].node}); only a site that is gone can be "
                "forgotten"
            )
        for name in self.storage_names():
            holding = {r.site for shard in self.storage(name).shards for r in shard.replicas}
            if site in holding or any(site in target for target in self.targets(name)):
                raise Refused(f"site {site} is in the replica set of {name!r}")
        return site


def _transitions(shard: Shard, target: Sequence[SiteId]) -> list[Transition]:
    """A shard's pending changes towards `target`: sites to join, then sites to leave."""
    holding = [replica.site for replica in shard.replicas]
    joining = [Transition(site, JOINING) for site in target if site not in holding]
    return joining + [Transition(site, LEAVING) for site in holding if site not in target]
