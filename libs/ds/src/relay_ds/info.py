"""The `/ds` values: what a storage, a shard and a site look like (EMQX's DS API), what one
retainer says about its share (`Description`), and `DsInfo`, what `GET /ds/info` answers and
`relayctl ds info` prints.

One shape per value, from the store to the client: the stream store builds `Storage` and
`Description`, the retainer sends a `Description` as its answer, the ingress merges them
(`relay_ds.view`) and answers with these classes as its response models, relayctl reads
`DsInfo` back. The services turn them into JSON and back (frozen dataclasses, which pydantic
validates and dumps as they are); nothing here maps one shape into another.

Invariants:
- a field with a default is one the API leaves out while it has that value (a shard's
  `transitions` while there are none; a site's shard `status` or `transition` it does not have):
  the ingress answers with `response_model_exclude_defaults`;
- shard ids are strings of numbers (EMQX's shard ids are strings); in a `Description` and in the
  merged view they are global (`relay_bus.routing.global_shard`), so retainers' never collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relay_ds.sites import SiteId

UP = "up"
DOWN = "down"
JOINING = "joining"
LEAVING = "leaving"


@dataclass(frozen=True)
class Replica:
    site: SiteId
    status: str
    """`up` (a live site holding the shard) or `down`."""


@dataclass(frozen=True)
class Transition:
    site: SiteId
    transition: str
    """`joining` (in the target, not yet holding data) or `leaving`: replica-set changes not yet
    carried out (no data moves until the replicator exists)."""


@dataclass(frozen=True)
class Shard:
    id: str
    replicas: list[Replica]
    transitions: list[Transition] = field(default_factory=list)


@dataclass(frozen=True)
class Storage:
    name: str
    shards: list[Shard]


@dataclass(frozen=True)
class KvChange:
    """A membership change of the replicators under way (storage `kv`)."""

    version: int
    """The version the new view will have."""
    sites: list[SiteId]
    """The sites of the new view."""
    reports: dict[str, str]
    """How far each site taking part is: `installed`, `pulled`, `reading_new`, `done`."""


@dataclass(frozen=True)
class KvStorage:
    """The storage `kv` (the replicators' key-value data) as `GET /ds/storages/kv` shows it:
    `Storage`'s fields, its 65,536 fixed shards summarised as one entry (id `"0-65535"`, every
    site of the view as its replicas, each placed by rendezvous hashing per key's N; sites
    joining or leaving as `transitions`), plus the view's `version` and `sites` and the change
    under way."""

    name: str
    shards: list[Shard]
    version: int
    sites: list[SiteId]
    change: KvChange | None = None


@dataclass(frozen=True)
class SiteShard:
    """A shard a site holds (`status`) or is to hold or let go (`transition`); both while it
    is leaving."""

    storage: str
    id: str
    status: str | None = None
    transition: str | None = None


@dataclass(frozen=True)
class Site:
    """One site as `GET /ds/sites/{site}` shows it."""

    node: str
    up: bool
    shards: list[SiteShard]


@dataclass(frozen=True)
class SiteSummary:
    site: SiteId
    node: str
    up: bool


@dataclass(frozen=True)
class Retainer:
    instance: str
    site: SiteId
    partitions: list[int]


@dataclass(frozen=True)
class DsInfo:
    """What `relayctl ds info` prints: `this_site` is the site of the retainer owning
    partition 0."""

    this_site: SiteId
    sites: list[SiteSummary]
    storages: list[Storage]
    retainers: list[Retainer]


# -- one retainer's share, as it answers `describe` -------------------------------------------


@dataclass(frozen=True)
class KnownSite:
    site: SiteId
    node: str
    """The node (pod or host) that last registered the site; informative only."""


@dataclass(frozen=True)
class StorageShare:
    """A storage as one retainer holds it: its replica-set target and its shards."""

    name: str
    replicas: list[SiteId]
    shards: list[Shard]


@dataclass(frozen=True)
class Description:
    """What one retainer (one site) knows: its site and node, the partitions it owns (lowest
    first), the sites it has registered (itself included) and its share of each storage."""

    site: SiteId
    node: str
    partitions: list[int]
    sites: list[KnownSite]
    storages: list[StorageShare]


def render_info(info: DsInfo) -> str:
    """The text of `ds info`: THIS SITE, SITES and SHARDS sections laid out as EMQX prints them
    (pending transitions follow the replicas as `+SITE` / `-SITE`)."""
    lines = ["THIS SITE:", info.this_site, "", "SITES:"]
    for site in info.sites:
        lines.append(f"{site.site}    {site.node!r:<30}    {UP if site.up else DOWN}")
    lines += ["", "SHARDS:", f"{'Shard':<34}Replicas"]
    for storage in info.storages:
        for shard in storage.shards:
            cells: list[str] = [r.site for r in shard.replicas]
            for t in shard.transitions:
                cells.append(("+" if t.transition == JOINING else "-") + t.site)
            lines.append(f"{storage.name + '/' + shard.id:<34}{' '.join(cells)}")
    return "\n".join(lines) + "\n"
