"""When a tombstone may be purged (Cassandra's `gc_grace_seconds`, and its resurrected-delete
bug class).

A value that shows nothing to clients (a deleted or expired register, a set with no live
member, a map whose fields are all deleted) is a tombstone: it stays stored, versioned, visible
to internal reads and to anti-entropy, so a replica that missed the delete learns it instead of
handing the old value back. It may be dropped only when both hold:
- `gc_grace` has passed since it became a tombstone (the time a late replica, a hint or a
  restored backup has to deliver it), and
- its shard completed an anti-entropy sync with every replica that *started* after it became a
  tombstone: every replica then holds the tombstone (or something newer), so none can hand the
  deleted value back. This is the repair guard; without it (`guard=False`) a replica cut off
  for longer than `gc_grace` resurrects the value (`tests/kv/test_gc.py` shows both).

Invariant: `purgeable` is a pure function of the value, the clock and the shard's last
completed sync; a live value is never purgeable.
"""

from __future__ import annotations

from relay_kv.crdt import AWSet, KvMap, Register, Value


def _register_since(register: Register, now_ms: int) -> int | None:
    if register.value is None:
        return register.version.wall_ms
    if register.expires_at is not None and register.expires_at <= now_ms:
        return max(register.expires_at, register.version.wall_ms)
    return None


def tombstone_since(value: Value, now_ms: int) -> int | None:
    """Since when (Unix ms) `value` has shown nothing to clients, or None if it shows something."""
    if isinstance(value, Register):
        return _register_since(value, now_ms)
    if isinstance(value, AWSet):
        if value.members(now_ms):
            return None
        expiries = [e for dots in value.entries.values() for e in dots.values() if e is not None]
        return max([value.updated.wall_ms, *expiries])
    assert isinstance(value, KvMap)
    times = [_register_since(register, now_ms) for register in value.fields.values()]
    if any(t is None for t in times):
        return None
    return max([t for t in times if t is not None], default=0)


END_OF_TIME_MS = 1 << 62


def mortal(value: Value) -> bool:
    """Whether `value` is, or will become by expiry alone, a tombstone: the values garbage
    collection must look at (a live value without expiry waits for a write to become one)."""
    return tombstone_since(value, END_OF_TIME_MS) is not None


def purgeable(
    value: Value, now_ms: int, gc_grace_ms: int, synced_ms: int | None, *, guard: bool = True
) -> bool:
    """`synced_ms`: when the shard's last completed sync with all its replicas started (None:
    never)."""
    since = tombstone_since(value, now_ms)
    if since is None or now_ms < since + gc_grace_ms:
        return False
    if not guard:
        return True
    return synced_ms is not None and synced_ms >= since
