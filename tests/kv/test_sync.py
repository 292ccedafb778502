"""Anti-entropy between two real replicators (in process, real sockets and stores): a pass
listing a few shards per call and exchanging a few keys per batch leaves both sites with the
join of what either held, equal hashes, and the newer version of every key held twice; a
write after a pass is found by the next one."""

from __future__ import annotations

import time
from pathlib import Path

from relay_kv import membership, placement
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


async def test_a_site_hands_back_what_it_holds_of_shards_it_no_longer_homes(
    tmp_path: Path,
) -> None:
    """A site out of a shard's home set (a view change moved it) holding keys of the shard (a
    write below the majority, or one the joiners' pull missed while this site was down): a pass
    writes them to the shard's home replicas and forgets them here; not during a change, not
    while a home replica is down, and never a value older than `gc_grace` (its delete may have
    been purged at home since: handing it back would resurrect it)."""
    async with inprocess.replicators(tmp_path, {"a": 0, "b": 0, "c": 0}) as coordinators:
        a, b, c = (coordinators[name].replicas for name in "abc")
        sites = {r.peers.me: r for r in (a, b, c)}
        now = int(time.time() * 1000)
        sync = Sync(c, lambda: int(time.time() * 1000), 0, batch=3, shards_per_call=2)

        def home(key: str) -> tuple[str, ...]:
            return sync.home(2, placement.shard_of("ns", key))

        def holders(key: str) -> set[str]:
            shard = placement.shard_of("ns", key)
            return {s for s, r in sites.items() if r.local.store.get(2, shard, "ns", key)}

        keys = [f"k{i}" for i in range(300)]
        foreign = [k for k in keys if c.peers.me not in home(k)][:10]
        homed = [k for k in keys if c.peers.me in home(k)][:4]
        stale = foreign.pop()
        await c.local.store.merge(
            [write(k, b"c", now) for k in [*foreign, *homed]]
            + [write(stale, b"old", now - 864_000_000 - 60_000)]  # the default gc_grace: 10 d
        )
        c.peers.change = membership.Change(c.peers.view, c.peers.view)
        assert await sync.hand_back() == 0  # a joiner's pulled shards look foreign meanwhile
        c.peers.change = None
        c.peers.mark_down(a.peers.me)  # home to every shard c is not (n = 2 of 3 sites)
        assert await sync.hand_back() == 0
        assert all(holders(k) == {c.peers.me} for k in [*foreign, stale])

        c.peers.mark_up(a.peers.me)
        assert await sync.hand_back() == len(foreign)
        for key in foreign:
            assert holders(key) == set(home(key)), key
        for key in homed:
            assert holders(key) == {c.peers.me}
        assert holders(stale) == {c.peers.me}
        assert c.local.store.check() == []
        assert await sync.hand_back() == 0
