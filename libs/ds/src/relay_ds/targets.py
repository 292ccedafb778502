"""Replica-set targets as ONE replicated record per storage: the value the `/ds` admin writes
to the replicators (key = the storage's name in the reserved namespace `NAMESPACE`, a
last-writer-wins register written and read with a majority quorum), and the rules that read it.

A record holds the target (`replicas`) and the node of each of its sites (`nodes`), so that a
retainer that lost its volume, and with it `sites.json`, can register the target's sites again
before it records the target. Versions are the register's (hybrid logical clocks): a later
write wins.

Migration ("read both until written"): a storage with no record yet keeps the targets its
retainers hold in their own `db.json` files; the first write through `/ds` makes the record
the only source for that storage.

Invariants:
- `decode(encode(r)) == r`, and `decode` either returns a record whose target passes
  `relay_ds.sites.parse_target` and names a node for every site, or raises `Refused`;
- `changes` proposes a target only for a storage that has a record and whose local target
  differs from it: a storage without a record is never changed (it was not written yet);
- `not_older` never lets a record older than one already applied through (reads may finish
  out of order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relay_ds.errors import Refused
from relay_ds.sites import SiteId, parse_site, parse_target

NAMESPACE = "$ds"
"""Reserved namespace of the replicators holding one record per storage (admin requests only;
its N and quorum are `relay_kv.names.SYSTEM`'s)."""
FORMAT = 1


@dataclass(frozen=True)
class TargetRecord:
    replicas: list[SiteId]
    """The replica-set target, in the order it was given."""
    nodes: dict[SiteId, str]
    """Each target site's node, as the sites were known when the target was written."""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "f": FORMAT,
                "replicas": list(self.replicas),
                "nodes": dict(sorted(self.nodes.items())),
            },
            separators=(",", ":"),
        ).encode()


def record(target: Sequence[SiteId], known: Mapping[SiteId, str]) -> TargetRecord:
    """The record of a checked target (every site known: `relay_ds.sites.check_known`)."""
    return TargetRecord(list(target), {site: known[site] for site in target})


def decode(data: bytes) -> TargetRecord:
    """The record `data` holds, or `Refused` saying why it is not one."""
    try:
        raw = json.loads(data)
    except ValueError:
        raise Refused("a target record is not JSON") from None
    if not isinstance(raw, dict) or raw.get("f") != FORMAT:
        raise Refused(f"a target record has format {FORMAT}")
    replicas, nodes = raw.get("replicas"), raw.get("nodes")
    if not isinstance(replicas, list) or not isinstance(nodes, dict):
        raise Refused("a target record has a list 'replicas' and an object 'nodes'")
    target = parse_target(replicas)
    parsed = {parse_site(site): node for site, node in nodes.items()}
    if any(not isinstance(parsed.get(site), str) or not parsed[site] for site in target):
        raise Refused("a target record names a node for every site of its target")
    return TargetRecord(target, {site: str(parsed[site]) for site in target})


@dataclass(frozen=True)
class Read:
    """A record as a quorum read returned it, with the register's version (text that orders
    as the versions do)."""

    version: str
    record: TargetRecord


def not_older(read: Mapping[str, Read], applied: Mapping[str, str]) -> dict[str, TargetRecord]:
    """The records read that are not older than the version last applied for their storage:
    a read that started before another but is applied after it must not put back its older
    record."""
    return {name: r.record for name, r in read.items() if r.version >= applied.get(name, "")}


def changes(
    local: Mapping[str, Sequence[SiteId]], stored: Mapping[str, TargetRecord]
) -> dict[str, TargetRecord]:
    """The records to apply to a store whose targets are `local` (by storage name): each
    storage it holds whose stored target differs from its own."""
    return {
        name: stored[name]
        for name, target in sorted(local.items())
        if name in stored and list(target) != stored[name].replicas
    }
