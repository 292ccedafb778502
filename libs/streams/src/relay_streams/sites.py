"""Sites: this node's persistent identity, the sites it knows, and replica-set records.

As in EMQX DS, a site id is 16 hex digits drawn at random the first time a store directory is
used (`site.json`), independent of host and pod names, so a rescheduled pod that keeps its volume
keeps its site. Other sites are known once registered (`sites.json`; the operator will register
them at join). Each database records a replica set: `target` (what the operator asked for) and
`current` (sites that hold the data). Until the replicator exists, `current` is only ever this
site; a difference between the two is shown as pending transitions (`+SITE` joining, `-SITE`
leaving), the way EMQX shows them while it moves shards.

Site ids, targets and the `/ds` values are `relay_ds`'s (one shape from here to relayctl); this
module keeps them on disk and refuses with `BadInput`.

Invariants: `site.json` is written once and never changed; a site id is stored in upper case;
a replica set is never empty and names only known sites; a site that is in any replica set
cannot be forgotten.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay_ds import sites as ds_sites
from relay_ds.errors import Refused
from relay_ds.info import DOWN, JOINING, LEAVING, UP, KnownSite, Replica, Shard, Transition
from relay_ds.sites import SiteId
from relay_streams import files
from relay_streams.errors import BadInput, CorruptRecord, NotFound


def parse_site(site: object) -> SiteId:
    """A site id in its stored form (upper case), or `BadInput`."""
    try:
        return ds_sites.parse_site(site)
    except Refused as e:
        raise BadInput(str(e)) from None


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


class SiteRegistry:
    """`sites.json`: every site this node knows, itself included."""

    def __init__(self, root: Path, this_site: SiteId, node: str | None, save: bool = True) -> None:
        """`node`: this site's node name, recorded if new or changed (with `save`); None
        keeps the recorded one."""
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
        if node is None:
            node = self.sites[this_site].node if this_site in self.sites else this_site
        if self.sites.get(this_site) != KnownSite(this_site, node):
            self.sites[this_site] = KnownSite(this_site, node)
            if save:
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
    try:
        parsed = ds_sites.parse_target(sites)
        ds_sites.check_known(parsed, registry.sites)
    except Refused as e:
        raise BadInput(str(e)) from None
    return parsed


def shard_infos(replicas: ReplicaSet, shards: int, this_site: SiteId) -> list[Shard]:
    """Each of a database's shards as `/ds` shows it: the sites holding it (`current`: this one
    up, others down) and the pending transitions towards `target`."""
    statuses = [Replica(s, UP if s == this_site else DOWN) for s in replicas.current]
    transitions = [Transition(s, JOINING) for s in replicas.target if s not in replicas.current]
    transitions += [Transition(s, LEAVING) for s in replicas.current if s not in replicas.target]
    return [Shard(str(i), list(statuses), list(transitions)) for i in range(shards)]
