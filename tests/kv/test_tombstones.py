"""Tombstone GC: only after gc_grace and a completed sync that started after the delete."""

from __future__ import annotations

from relay_kv import tombstones
from relay_kv.clock import Version
from relay_kv.crdt import AWSet, KvMap, Register

SITE = "A" * 16


def test_a_delete_is_purged_after_grace_and_a_later_sync_only() -> None:
    deleted = Register(Version(1000, 0, SITE), None)
    assert not tombstones.purgeable(deleted, 1500, 1000, synced_ms=1200)  # grace not over
    assert not tombstones.purgeable(deleted, 2500, 1000, synced_ms=None)  # never synced
    assert not tombstones.purgeable(deleted, 2500, 1000, synced_ms=900)  # sync before delete
    assert tombstones.purgeable(deleted, 2500, 1000, synced_ms=1000)
    assert tombstones.purgeable(deleted, 2500, 1000, synced_ms=None, guard=False)


def test_live_values_are_never_purged() -> None:
    live = Register(Version(1, 0, SITE), b"v")
    assert not tombstones.purgeable(live, 10**9, 0, synced_ms=10**9)
    s = AWSet().add([b"m"], Version(1, 0, SITE))
    assert not tombstones.purgeable(s, 10**9, 0, synced_ms=10**9)
    m = KvMap({"f": live, "g": Register(Version(2, 0, SITE), None)})
    assert not tombstones.purgeable(m, 10**9, 0, synced_ms=10**9)


def test_expired_and_emptied_values_are_tombstones() -> None:
    expired = Register(Version(1, 0, SITE), b"v", expires_at=50)
    assert tombstones.tombstone_since(expired, 60) == 50
    emptied = AWSet().add([b"m"], Version(1, 0, SITE)).remove([b"m"], Version(70, 0, SITE))
    assert tombstones.tombstone_since(emptied, 100) == 70
