"""Anti-entropy between two real replicators (in process, real sockets and stores): a pass
listing a few shards per call and exchanging a few keys per batch leaves both sites with the
join of what either held, equal hashes, and the newer version of every key held twice; a
write after a pass is found by the next one."""

from __future__ import annotations

import time
from pathlib import Path

from relay_kv import placement
from relay_kv.clock import Version
from relay_kv.crdt import Register
from relay_replicator.store import Write
from relay_replicator.sync import Sync
from tests.kv import inprocess

A = "A" * 16


def write(key: str, value: bytes, wall: int) -> Write:
    return Write(2, placement.shard_of("ns", key), "ns", key, Register(Version(wall, 0, A), value))


async def test_a_pass_in_small_batches_leaves_both_sites_with_the_join(tmp_path: Path) -> None:
    async with inprocess.replicators(tmp_path, {"a": 0, "b": 0}) as coordinators:
        a, b = coordinators["a"].replicas, coordinators["b"].replicas
        only_a = [write(f"a{i}", b"a", 1) for i in range(40)]
        only_b = [write(f"b{i}", b"b", 1) for i in range(15)]
        await a.local.store.merge([*only_a, write("both", b"old", 1)])
        await b.local.store.merge([*only_b, write("both", b"new", 2)])

        sync = Sync(a, lambda: int(time.time() * 1000), 0, batch=3, shards_per_call=2)
        found = await sync.run_pass()

        assert found[b.peers.me] > 2  # more shards differed than one call lists
        assert a.local.store.tree[2].shards == b.local.store.tree[2].shards
        for replica in (a, b):
            store = replica.local.store
            keys = {(w.key, w.shard) for w in [*only_a, *only_b]}
            for key, shard in keys:
                assert store.get(2, shard, "ns", key) is not None, key
            both = store.get(2, placement.shard_of("ns", "both"), "ns", "both")
            assert isinstance(both, Register)
            assert both.value == b"new"
            assert store.check() == []
        assert await sync.run_pass() == {b.peers.me: 0}
        # Group hashes are remembered between passes only while the tree is unchanged.
        await a.local.store.merge([write("late", b"a", 3)])
        assert await sync.run_pass() == {b.peers.me: 1}
        assert b.local.store.get(2, placement.shard_of("ns", "late"), "ns", "late") is not None
