"""The client operations of `/v1/kv` on values: what a delete, a set change or a page means, and
which operations a key's current value allows. Pure functions of the merged value a quorum
read returned; the coordinator stamps, reads and writes around them.

Invariants:
- an operation of one type on a key whose value is of another type is refused (`WrongType`)
  when that value is live, or when it is a tombstone of a type that would still win the merge
  (`relay_kv.crdt`'s rank): the refused write would otherwise vanish or hide the value;
- a set change applies its removes, then its adds: a member in both ends up present (add wins);
- a delete removes what the reader observed: a register becomes a tombstone, a set loses every
  observed member, a map gets a tombstone per visible field;
- `page` returns at most `limit` items strictly after the cursor, and a next cursor only when
  more items follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from relay_kv.clock import Version
from relay_kv.crdt import AWSet, KvMap, Register, Value, is_live

T = TypeVar("T")

TYPE_NAMES: dict[type, str] = {Register: "string", AWSet: "set", KvMap: "map"}


class WrongType(ValueError):
    """The key holds a value of another type."""


def type_name(value: Value | type) -> str:
    return TYPE_NAMES[value if isinstance(value, type) else type(value)]


def check_type(current: Value | None, wanted: type[Register | AWSet | KvMap], now_ms: int) -> None:
    if current is None or isinstance(current, wanted):
        return
    if is_live(current, now_ms) or current.RANK > wanted.RANK:
        raise WrongType(f"key holds a {type_name(current)}")


def versions(value: Value) -> list[Version]:
    """Every version a value carries (what a replica checks and a clock observes)."""
    if isinstance(value, Register):
        return [value.version]
    if isinstance(value, AWSet):
        return [value.updated]
    return [register.version for register in value.fields.values()]


def change_members(
    current: Value | None,
    add: Sequence[bytes],
    remove: Sequence[bytes],
    version: Version,
    expires_at: int | None,
) -> AWSet:
    state = current if isinstance(current, AWSet) else AWSet()
    state = state.remove(remove, version)
    if add:
        state = state.add(add, version, expires_at)
    return state


def delete(current: Value | None, version: Version, now_ms: int) -> Value:
    if isinstance(current, AWSet):
        return current.remove(list(current.entries), version)
    if isinstance(current, KvMap):
        return KvMap({name: Register(version, None) for name in current.visible(now_ms)})
    return Register(version, None)


def page(
    items: Iterable[T], key: Callable[[T], bytes], after: bytes | None, limit: int
) -> tuple[list[T], bytes | None]:
    """Items of a sorted sequence after `after`, at most `limit`, and the next cursor."""
    found: list[T] = []
    for item in items:
        if after is not None and key(item) <= after:
            continue
        if len(found) == limit:
            return found, key(found[-1])
        found.append(item)
    return found, None
