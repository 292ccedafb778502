"""The replicator's RocksDB store on real files: writes merge (twice is once), shard hashes stay
equal to a recompute through writes, purges and a reopen, hints merge per key and are deleted
only if unchanged, and the hint byte limit holds."""

from __future__ import annotations

import json
from pathlib import Path

from rocksdict import Options, Rdict

from relay_kv import hints, placement
from relay_kv.clock import Version
from relay_kv.crdt import AWSet, Register
from relay_replicator.store import LAYOUT, META, MORTAL, KvStore, Write

A = "A" * 16


def write(key: str, value: Register | AWSet, n: int = 3) -> Write:
    return Write(n, placement.shard_of("ns", key), "ns", key, value)


async def test_writes_merge_and_hashes_survive_a_reopen(tmp_path: Path) -> None:
    store = KvStore(tmp_path / "db", hints.HintLimits())
    store.open()
    old = Register(Version(1, 0, A), b"old")
    new = Register(Version(2, 0, A), b"new")
    applied = await store.merge(
        [write("k", new), write("j", AWSet().add([b"m"], Version(1, 0, A)))]
    )
    assert [a.newer for a in applied] == [None, None]
    late = await store.merge([write("k", old)])  # an older write: reported, not applied
    assert late[0].newer == new.version
    assert late[0].stored == new
    before = {n: dict(t.shards) for n, t in store.tree.items()}
    await store.merge([write("k", new)])  # the same write again changes nothing
    assert {n: dict(t.shards) for n, t in store.tree.items()} == before
    assert store.check() == []
    await store.close()

    again = KvStore(tmp_path / "db", hints.HintLimits())
    again.open()
    assert again.get(3, placement.shard_of("ns", "k"), "ns", "k") == new
    assert {n: dict(t.shards) for n, t in again.tree.items()} == before
    assert again.check() == []
    tombstone = Register(Version(3, 0, A), None)
    await again.merge([write("k", tombstone)])
    raw = again.get_raw(3, placement.shard_of("ns", "k"), "ns", "k")
    assert raw is not None
    await again.purge([(write("k", tombstone), b"not what is stored")])  # changed meanwhile: kept
    assert again.get(3, placement.shard_of("ns", "k"), "ns", "k") == tombstone
    await again.purge([(write("k", tombstone), raw)])
    assert again.get(3, placement.shard_of("ns", "k"), "ns", "k") is None
    assert again.check() == []
    await again.close()


async def test_a_shard_whose_number_ends_in_ff_lists_its_own_keys(tmp_path: Path) -> None:
    """A shard's key range ends where the next shard's begins, also when the prefix ends in
    0xff bytes (shards 255, 0xffff): anti-entropy lists such shards like any other."""
    store = KvStore(tmp_path / "db", hints.HintLimits())
    store.open()
    value = Register(Version(1, 0, A), b"v")
    shards = [254, 255, 256, 0xFFFF]
    await store.merge([Write(3, s, "ns", f"k{s}", value) for s in shards])
    await store.merge([Write(4, 0, "ns", "next-n", value)])
    for shard in shards:
        assert [key for _, key, _ in store.shard_keys(3, shard)] == [f"k{shard}"]
    assert store.check() == []
    await store.close()


async def test_hints_merge_per_key_and_respect_the_limit(tmp_path: Path) -> None:
    store = KvStore(tmp_path / "db", hints.HintLimits(max_bytes=600))
    store.open()
    first = hints.Hint("B" * 16, 3, "ns", "k", Register(Version(1, 0, A), b"1"), created_ms=10)
    second = hints.Hint("B" * 16, 3, "ns", "k", Register(Version(2, 0, A), b"2"), created_ms=20)
    assert await store.add_hints([first])
    assert await store.add_hints([second])
    ((key, raw, held),) = store.hints_for("B" * 16, 10)
    assert held.value == second.value
    assert held.created_ms == 10  # the oldest write it carries
    assert store.hint_targets() == {"B" * 16}
    big = hints.Hint("C" * 16, 3, "ns", "x", Register(Version(1, 0, A), b"x" * 600), 1)
    assert not await store.add_hints([big])  # over the byte limit: refused
    await store.drop_hints([(key, raw)])
    assert store.hints_for("B" * 16, 10) == []
    assert store.hint_bytes == 0
    await store.close()


async def test_the_gc_index_names_exactly_the_mortal_values(tmp_path: Path) -> None:
    """Garbage collection reads only indexed keys: tombstones and values that expire, kept in
    step through writes that make a value mortal or live again, purges, and a store written
    before the index existed (built once at open)."""
    store = KvStore(tmp_path / "db", hints.HintLimits())
    store.open()
    await store.merge(
        [
            write("live", Register(Version(1, 0, A), b"v")),
            write("deleted", Register(Version(1, 0, A), None)),
            write("expiring", Register(Version(1, 0, A), b"v", expires_at=5)),
            write("set", AWSet().add([b"m"], Version(1, 0, A))),
        ]
    )
    assert sorted(k for *_, k, _ in store.mortal_keys()) == ["deleted", "expiring"]
    await store.merge(
        [
            write("live", Register(Version(2, 0, A), None)),  # deleted: now mortal
            write("deleted", Register(Version(2, 0, A), b"back")),  # written again: live
            write("set", AWSet().add([b"m"], Version(1, 0, A)).remove([b"m"], Version(2, 0, A))),
        ]
    )
    assert sorted(k for *_, k, _ in store.mortal_keys()) == ["expiring", "live", "set"]
    assert store.check() == []
    shard = placement.shard_of("ns", "live")
    raw = store.get_raw(3, shard, "ns", "live")
    assert raw is not None
    await store.purge([(write("live", Register(Version(2, 0, A), None)), raw)])
    assert sorted(k for *_, k, _ in store.mortal_keys()) == ["expiring", "set"]
    assert store.check() == []
    await store.close()

    # A store of the version before the index: its META lacks `gc_index` and no `g` rows.
    db = Rdict(str(tmp_path / "db"), Options(raw_mode=True))
    db.put(META, json.dumps({"v": 1, "layout": LAYOUT}).encode())
    for key, _ in list(db.items(from_key=MORTAL)):
        if isinstance(key, bytes) and key.startswith(MORTAL):
            db.delete(key)
    db.close()
    again = KvStore(tmp_path / "db", hints.HintLimits())
    again.open()
    assert sorted(k for *_, k, _ in again.mortal_keys()) == ["expiring", "set"]
    assert again.check() == []
    await again.close()
