"""The retainer's share of the `/ds` admin API: what its stream store knows (its site, the
sites it has registered, each database's replica set and shards), and replica-set and site
changes. Each retainer instance is one site; the ingress gathers every retainer's description
and merges them (`relay_ingress.ds_admin`).

Blocking functions (JSON files with fsync): the caller runs them in a worker thread, one at a
time per process (they read and write `sites.json` and `db.json`).

Invariants:
- shard ids are global (`relay_bus.routing.global_shard` of this retainer's lowest partition),
  so they never collide with another retainer's and match rank X of the shard's streams;
- before a replica change, every peer site the asker lists is registered here (the operator's
  site registration until it exists), so every retainer validates the same set the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relay_bus import routing
from relay_streams import sites
from relay_streams.errors import BadInput
from relay_streams.store import StreamStore


def describe(store: StreamStore, node: str, owned: Sequence[int]) -> dict[str, Any]:
    owner = owned[0]
    storages = []
    for name in store.storages():
        info = store.storage(name)
        storages.append(
            {
                "name": name,
                "replicas": list(store.replicas(name)),
                "shards": [
                    {
                        "id": str(routing.global_shard(owner, int(shard.id))),
                        "replicas": [{"site": r.site, "status": r.status} for r in shard.replicas],
                        "transitions": [
                            {"site": t.site, "transition": t.transition} for t in shard.transitions
                        ],
                    }
                    for shard in info.shards
                ],
            }
        )
    known = sorted(store.registry.sites.values(), key=lambda k: k.site)
    return {
        "site": store.this_site(),
        "node": node,
        "partitions": list(owned),
        "sites": [{"site": k.site, "node": k.node} for k in known],
        "storages": storages,
    }


def _register(store: StreamStore, peers: Mapping[str, str]) -> None:
    for site, node in peers.items():
        parsed = sites.parse_site(site)
        if parsed != store.this_site() and parsed not in store.registry.sites:
            store.register_site(parsed, node)


def set_replicas(
    store: StreamStore, db: str, target: Sequence[str], peers: Mapping[str, str]
) -> None:
    store.db(db)
    _register(store, peers)
    store.set_replicas(db, list(target))


def join(store: StreamStore, db: str, site: str, peers: Mapping[str, str]) -> None:
    store.db(db)
    _register(store, peers)
    store.join(db, site)


def leave(store: StreamStore, db: str, site: str) -> None:
    store.db(db)
    store.leave(db, site)


def forget(store: StreamStore, site: str) -> None:
    """Forget the site if this store knows it (another retainer may be the one that does)."""
    parsed = sites.parse_site(site)
    if parsed == store.this_site():
        raise BadInput(f"{parsed} is this retainer's own site; it cannot be forgotten")
    if parsed in store.registry.sites:
        store.forget_site(parsed)
