"""Where a key lives: fixed shards, and per shard a replica set chosen by rendezvous hashing.

- A key's shard is the top `SHARD_BITS` bits of blake2b(namespace NUL key): 65,536 shards, fixed
  forever, so a shard is the unit of placement, anti-entropy and hand-over. Only the part of a
  stored key before its first NUL counts: the rows of a key (a set's members,
  `relay_kv.setrows`) live in the key's shard. Client keys hold no NUL (`names.check_key`).
- A shard's preference list orders every site of the membership view by
  blake2b(shard, site), highest first. Its first N sites are the home replicas; the rest, in
  order, are the fallbacks that hold hints for unreachable home replicas.

Invariants:
- every function here is a pure function of its arguments (no salted `hash`), so every site,
  every restart and every test agrees on placement;
- adding one site to a view of n moves a shard's replica set only when the new site ranks in
  the shard's top N, which happens for about N/(n+1) of the shards (checked by hypothesis in
  `tests/kv/test_placement.py`); removing a site moves only the shards it held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SHARD_BITS = 16
SHARDS = 1 << SHARD_BITS


def shard_of(namespace: str, key: str) -> int:
    key = key.partition("\0")[0]
    data = namespace.encode("utf-8", "surrogatepass") + b"\0" + key.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SHARD_BITS)


def _rank(shard: int, site: str) -> bytes:
    return hashlib.blake2b(shard.to_bytes(4, "big") + site.encode(), digest_size=8).digest()


def preference(shard: int, sites: Iterable[str]) -> list[str]:
    """Every site, best first, for `shard`."""
    return sorted(set(sites), key=lambda site: (_rank(shard, site), site), reverse=True)


@dataclass(frozen=True)
class Replicas:
    home: tuple[str, ...]
    """The first N sites of the preference list."""
    fallback: tuple[str, ...]
    """The rest, in preference order: who holds hints for an unreachable home replica."""


def replicas(shard: int, sites: Iterable[str], n: int) -> Replicas:
    ordered = preference(shard, sites)
    return Replicas(tuple(ordered[:n]), tuple(ordered[n:]))


@dataclass(frozen=True)
class View:
    """The membership: every site with where to reach it, and a version that grows with every
    change (a newer view replaces an older one everywhere)."""

    version: int
    sites: tuple[str, ...]

    def replicas(self, shard: int, n: int) -> Replicas:
        return replicas(shard, self.sites, n)

    def shards_of(self, site: str, n: int, shards: Sequence[int] | None = None) -> list[int]:
        """The shards whose home replicas include `site` (all shards unless given)."""
        return [
            shard
            for shard in (range(SHARDS) if shards is None else shards)
            if site in self.replicas(shard, n).home
        ]


def moved(old: Iterable[str], new: Iterable[str], n: int, shards: Iterable[int]) -> int:
    """How many of `shards` change home replicas between two site sets."""
    old_sites, new_sites = tuple(old), tuple(new)
    return sum(
        set(replicas(s, old_sites, n).home) != set(replicas(s, new_sites, n).home) for s in shards
    )
