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


SAME_SHARD = ["k0", "k38831", "k289738", "k302877", "k424359", "k432755", "k481929", "k525477"]
"""Keys of one shard (found by search): a shard larger than a page of the key listing."""


async def test_a_shard_larger_than_a_page_is_listed_in_pages(tmp_path: Path) -> None:
    assert len({placement.shard_of("ns", key) for key in SAME_SHARD}) == 1
    async with inprocess.replicators(tmp_path, {"a": 0, "b": 0}) as coordinators:
        a, b = coordinators["a"].replicas, coordinators["b"].replicas
        # Interleaved in key order: each page of three holds keys of both sites.
        await a.local.store.merge([write(k, b"a", 1) for k in SAME_SHARD[::2]])
        await b.local.store.merge([write(k, b"b", 1) for k in SAME_SHARD[1::2]])
        await b.local.store.merge([write("elsewhere", b"b", 1)])
        sync = Sync(a, lambda: int(time.time() * 1000), 0, keys_per_call=3)
        shard = placement.shard_of("ns", SAME_SHARD[0])
        first = sync.keys(2, [shard], None, 3)
        assert len(first["keys"]) == 3
        assert first["more"]
        _, ns, key, _ = first["keys"][-1]
        rest = sync.keys(2, [shard], (shard, ns, key), 3)
        assert len(rest["keys"]) == 1
        assert not rest["more"]
        assert [r[2] for r in first["keys"] + rest["keys"]] == sorted(SAME_SHARD[::2])

        assert await sync.run_pass() == {b.peers.me: 2}  # the shard, and "elsewhere"'s
        for replica in (a, b):
            for key in [*SAME_SHARD, "elsewhere"]:
                assert replica.local.store.get(2, placement.shard_of("ns", key), "ns", key)
        assert a.local.store.tree[2].shards == b.local.store.tree[2].shards
        assert await sync.run_pass() == {b.peers.me: 0}
