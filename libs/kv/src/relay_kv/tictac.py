"""Tictac hashes (kv_index_tictactree): one hash per shard, kept up to date by every write.

A key's hash is blake2b over (namespace, key, the value's canonical bytes); a shard's hash is the
XOR of its keys' hashes, so a write changes it by XOR-ing the old key hash out and the new one
in, in the same write batch as the data: no tree is rebuilt, no scan is needed to know a shard's
hash. Shards are grouped (`GROUP_BITS`) for the first level of an exchange: two replicas compare
the XOR of the shards they share per group, then the shards of the groups that differ, then the
keys of the shards that differ.

Invariants (checked by hypothesis in `tests/kv/test_tictac.py`):
- after any sequence of writes and deletes, `Tree` equals `Tree.recompute` of the final keys;
- an absent key hashes to 0, so deleting the last key of a shard gives the empty shard's 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from relay_kv.placement import SHARD_BITS

GROUP_BITS = 8
GROUPS = 1 << GROUP_BITS


def key_hash(namespace: str, key: str, encoded: bytes | None) -> int:
    """The hash of one stored key (0 when absent)."""
    if encoded is None:
        return 0
    h = hashlib.blake2b(digest_size=8)
    h.update(namespace.encode("utf-8", "surrogatepass") + b"\0")
    h.update(key.encode("utf-8", "surrogatepass") + b"\0")
    h.update(encoded)
    return int.from_bytes(h.digest(), "big")


def differing(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[int]:
    """The groups or shards (keys of two exchange answers, hashes as hex) whose hashes differ;
    a missing entry is an empty (zero) one."""
    return sorted(int(k) for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def group_of(shard: int) -> int:
    return shard >> (SHARD_BITS - GROUP_BITS)


class Tree:
    """Shard hashes (sparse: an absent shard is 0)."""

    def __init__(self, shards: dict[int, int] | None = None) -> None:
        self.shards: dict[int, int] = {s: h for s, h in (shards or {}).items() if h}
        self.changes = 0
        """Counts `update` calls: what was computed from this tree at one count still holds."""

    def shard(self, shard: int) -> int:
        return self.shards.get(shard, 0)

    def update(self, shard: int, old: int, new: int) -> int:
        """Replace a key hash `old` by `new` in `shard`; returns the shard's new hash."""
        self.changes += 1
        value = self.shards.get(shard, 0) ^ old ^ new
        if value:
            self.shards[shard] = value
        else:
            self.shards.pop(shard, None)
        return value

    def groups(self, shards: Iterable[int]) -> dict[int, int]:
        """XOR of the given shards' hashes per group (only non-zero groups)."""
        out: dict[int, int] = {}
        for shard in shards:
            h = self.shards.get(shard, 0)
            if h:
                g = group_of(shard)
                out[g] = out.get(g, 0) ^ h
        return {g: h for g, h in out.items() if h}

    @classmethod
    def recompute(cls, keys: Iterable[tuple[int, str, str, bytes]]) -> Tree:
        """From (shard, namespace, key, encoded value) of every stored key."""
        tree = cls()
        for shard, namespace, key, encoded in keys:
            tree.update(shard, 0, key_hash(namespace, key, encoded))
        return tree
