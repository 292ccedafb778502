"""Sites: this node's persistent identity, the sites it knows, and replica-set records.

As in EMQX DS, a site id is 16 hex digits drawn at random the first time a store directory is
used (`site.json`), independent of host and pod names, so a rescheduled pod that keeps its volume
keeps its site. Other sites are known once registered (`sites.json`; the operator will register
them at join). Each database records a replica set: `target` (what the operator asked for) and
`current` (sites that hold the data). Until the replicator exists, `current` is only ever this
site; a difference between the two is shown as pending transitions (`+SITE` joining, `-SITE`
leaving), the way EMQX shows them while it moves shards.

Invariants: `site.json` is written once and never changed; a site id is stored in upper case;
a replica set is never empty and names only known sites; a site that is in any replica set
cannot be forgotten.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NewType

from relay_streams import files
from relay_streams.errors import BadInput, CorruptRecord, NotFound

SiteId = NewType("SiteId", str)
_SITE = re.compile(r"^[0-9A-F]{16}$")


def parse_site(site: object) -> SiteId:
    """A site id in its stored form (upper case), or `BadInput`."""
    if not isinstance(site, str) or not _SITE.match(site.upper()):
        raise BadInput(f"a site id is 16 hex digits, got {site!r}")
    return SiteId(site.upper())


def load_or_create_site(root: Path) -> SiteId:
    path = root / "site.json"
    if not path.exists():
        files.write_json(path, {"site": secrets.token_hex(8).upper(), "created_at": _now()})
    data = files.read_json(path)
    try:
        return parse_site(files.field(data, "site", str, path))
    except BadInput as e:
        raise CorruptRecord(f"{path}: {e}") from None


def _now() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class KnownSite:
    site: SiteId
    node: str
    """The node (pod or host) that last registered the site; informative only."""


class SiteRegistry:
    """`sites.json`: every site this node knows, itself included."""

    def __init__(self, root: Path, this_site: SiteId, node: str) -> None:
        self.path = root / "sites.json"
        self.this_site = this_site
        self.sites: dict[SiteId, KnownSite] = {}
        if self.path.exists():
            data = files.read_json(self.path)
            entries = files.field(data, "sites", dict, self.path)
            for site, entry in entries.items():
                try:
                    parsed = parse_site(site)
                except BadInput as e:
                    raise CorruptRecord(f"{self.path}: {e}") from None
                if not isinstance(entry, dict) or not isinstance(entry.get("node"), str):
                    raise CorruptRecord(f"{self.path}: site {site} has no node name")
                self.sites[parsed] = KnownSite(parsed, entry["node"])
        if self.sites.get(this_site) != KnownSite(this_site, node):
            self.sites[this_site] = KnownSite(this_site, node)
            self._save()

    def _save(self) -> None:
        entries = {site: {"node": known.node} for site, known in sorted(self.sites.items())}
        files.write_json(self.path, {"sites": entries})

    def known(self, site: object) -> SiteId:
        parsed = parse_site(site)
        if parsed not in self.sites:
            raise NotFound(f"unknown site {parsed}")
        return parsed

    def register(self, site: object, node: str) -> SiteId:
        parsed = parse_site(site)
        if not isinstance(node, str) or not node:
            raise BadInput("a site needs a node name")
        if parsed == self.this_site:
            raise BadInput(f"{parsed} is this site")
        self.sites[parsed] = KnownSite(parsed, node)
        self._save()
        return parsed

    def forget(self, site: SiteId) -> None:
        del self.sites[site]
        self._save()


@dataclass
class ReplicaSet:
    """A database's replica record (in `db.json`)."""

    target: list[SiteId]
    current: list[SiteId]

    def to_json(self) -> dict[str, Any]:
        return {"target": list(self.target), "current": list(self.current)}

    @classmethod
    def from_json(cls, data: object, path: Path) -> ReplicaSet:
        if not isinstance(data, dict):
            raise CorruptRecord(f"{path}: field 'replicas' is missing")
        try:
            return cls(
                [parse_site(s) for s in files.field(data, "target", list, path)],
                [parse_site(s) for s in files.field(data, "current", list, path)],
            )
        except BadInput as e:
            raise CorruptRecord(f"{path}: replicas: {e}") from None


def validate_target(sites: object, registry: SiteRegistry) -> list[SiteId]:
    """A new replica set target, or `BadInput` (unknown sites, empty, duplicates)."""
    if not isinstance(sites, list | tuple):
        raise BadInput("a replica set is a list of site ids")
    parsed = [parse_site(s) for s in sites]
    if not parsed:
        raise BadInput("a replica set needs at least one site")
    if len(set(parsed)) != len(parsed):
        raise BadInput("a replica set names a site twice")
    unknown = [s for s in parsed if s not in registry.sites]
    if unknown:
        raise BadInput(f"unknown sites: {', '.join(unknown)}")
    return parsed


# -- what `GET /ds/...` and `relayctl ds info` show -------------------------------------------


@dataclass(frozen=True)
class Replica:
    site: SiteId
    status: str
    """`up` (this site, serving), `down` (a recorded site that is not live here)."""


@dataclass(frozen=True)
class Transition:
    site: SiteId
    transition: str
    """`joining` (in the target, not yet holding data) or `leaving`."""


@dataclass(frozen=True)
class ShardInfo:
    id: str
    """The shard number as a string (EMQX's shard ids are strings)."""
    replicas: list[Replica]
    transitions: list[Transition] = field(default_factory=list)


@dataclass(frozen=True)
class StorageInfo:
    name: str
    shards: list[ShardInfo]


@dataclass(frozen=True)
class SiteShard:
    storage: str
    id: str
    status: str
    """The site's replica status (`up`, `down`) or its pending transition (`joining`,
    `leaving`)."""


@dataclass(frozen=True)
class SiteInfo:
    site: SiteId
    node: str
    up: bool
    shards: list[SiteShard] = field(default_factory=list)
    """Shards this site holds or is to hold (EMQX's `/ds/sites/:site`)."""


@dataclass(frozen=True)
class DsInfo:
    this_site: SiteId
    sites: list[SiteInfo]
    storages: list[StorageInfo]


def shard_infos(replicas: ReplicaSet, shards: int, this_site: SiteId) -> list[ShardInfo]:
    statuses = [Replica(s, "up" if s == this_site else "down") for s in replicas.current]
    transitions = [Transition(s, "joining") for s in replicas.target if s not in replicas.current]
    transitions += [Transition(s, "leaving") for s in replicas.current if s not in replicas.target]
    return [ShardInfo(str(i), list(statuses), list(transitions)) for i in range(shards)]


def render_info(info: DsInfo) -> str:
    """The text of `ds info`: THIS SITE, SITES and SHARDS sections laid out as EMQX prints them
    (pending transitions follow the replicas as `+SITE` / `-SITE`)."""
    lines = ["THIS SITE:", info.this_site, "", "SITES:"]
    for site in info.sites:
        lines.append(f"{site.site}    {site.node!r:<30}    {'up' if site.up else 'down'}")
    lines += ["", "SHARDS:", f"{'Shard':<34}Replicas"]
    for storage in info.storages:
        for shard in storage.shards:
            cells: list[str] = [r.site for r in shard.replicas]
            for t in shard.transitions:
                cells.append(("+" if t.transition == "joining" else "-") + t.site)
            lines.append(f"{storage.name + '/' + shard.id:<34}{' '.join(cells)}")
    return "\n".join(lines) + "\n"
