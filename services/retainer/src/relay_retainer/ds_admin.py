"""The retainer's share of the `/ds` admin API: what its stream store knows (its site, the
sites it has registered, each database's replica set and shards, `relay_ds.info.Description`),
and replica-set and site changes. Each retainer instance is one site; the ingress gathers every
retainer's description and merges them (`relay_ds.view`).

Blocking functions (JSON files with fsync): the caller runs them in a worker thread, one at a
time per process (they read and write `sites.json` and `db.json`).

Invariants:
- shard ids are global (`relay_bus.routing.global_shard` of this retainer's lowest partition),
  so they never collide with another retainer's and match rank X of the shard's streams;
- before a replica change, every peer site the asker lists is registered here (the operator's
  site registration until it exists), so every retainer validates the same set the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter

from relay_bus import routing
from relay_ds.info import Description
from relay_streams import sites
from relay_streams.errors import BadInput
from relay_streams.store import StreamStore

_DESCRIPTION = TypeAdapter(Description)


def describe(store: StreamStore, node: str, owned: Sequence[int]) -> dict[str, Any]:
    """The store's `Description` as the data of the `describe` answer."""
    description = store.description(node, owned, functools.partial(routing.global_shard, owned[0]))
    data: dict[str, Any] = _DESCRIPTION.dump_python(description, mode="json")
    return data


def _register(store: StreamStore, peers: Mapping[str, str]) -> None:
    for site, node in peers.items():
        parsed = sites.parse_site(site)
        if parsed != store.this_site() and parsed not in store.registry.sites:
            store.register_site(parsed, node)


def register(store: StreamStore, db: str, peers: Mapping[str, str]) -> None:
    """Register the asker's known sites for a change of `db` (which must exist here)."""
    store.db(db)
    _register(store, peers)


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
