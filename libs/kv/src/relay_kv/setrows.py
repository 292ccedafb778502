"""A set stored as rows (seed 004's "dots per element row"): a head row at the set's key and one
row per member, so an add or a remove reads and writes the rows it touches, not the whole set,
and no set is bounded by one value or one HTTP body.

- A member's row is stored at `row_key(key, member)` = key NUL hex(member): in the key's shard
  (`relay_kv.placement` places a key by its part before NUL; client keys hold no NUL), after
  the key and in member byte order (hex keeps it), so a page of members is a range of rows.
- A row is an `AWSet` of that member alone: its clock covers the adds of the member it has
  observed, its entry keeps the dots of the adds no remove observed. A remove leaves the clock
  and no entry: an element tombstone, merged and purged like any other value
  (`relay_kv.tombstones`: `gc_grace` and a completed sync). One member's row never merges with
  another's, so a row's clock covers nothing of the other members.
- The head is an `AWSet` at the key: it marks the key as a set (the type a register or map
  write is refused against), and its `updated` is the latest operation's version (every
  operation writes the head in the same batch as its rows, so no replica holds a row newer than
  its head). A set written whole before rows existed keeps its members and clock in the head
  (`legacy`): a member's state is the head seen by that member merged with its row
  (`element`), and the first operation on the member moves it into its row and drops it from
  the head (a remove of the dots it observed: an older copy of the head that still names the
  member drops them on merge).

Invariant (property-tested against the whole-set `AWSet` in `tests/kv/test_setrows.py`): for
any sequence of operations, from an empty or a legacy set, `members` of the head and rows
equals the members of the whole set the same operations give; removes before adds within an
operation, as `relay_kv.ops.change_members`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from relay_kv.clock import Version
from relay_kv.crdt import AWSet

SEP = "\0"


def row_key(key: str, member: bytes) -> str:
    return key + SEP + member.hex()


def row_prefix(key: str) -> str:
    """Every row of `key`, and nothing else, starts with this."""
    return key + SEP


def member_of(row: str) -> bytes:
    """The member a row key names (ValueError for a key that is no row)."""
    base, sep, member = row.partition(SEP)
    if not sep:
        raise ValueError(f"{base!r} is not a member's row")
    return bytes.fromhex(member)


def is_row(key: str) -> bool:
    return SEP in key


def element(head: AWSet | None, row: AWSet | None, member: bytes) -> AWSet:
    """One member's state: its row merged with what a legacy head holds of it."""
    legacy = head.only(member) if head is not None and head.clock else None
    if legacy is None:
        return row if row is not None else AWSet()
    return legacy if row is None else legacy.merge(row)


def change(
    head: AWSet | None,
    rows: Mapping[bytes, AWSet | None],
    add: Sequence[bytes],
    remove: Sequence[bytes],
    version: Version,
    expires_at: int | None,
) -> tuple[AWSet, dict[bytes, AWSet]]:
    """The head and the rows to write for one operation, from the head and the rows of the
    members it touches as read (`rows` must hold every member of `add` and `remove`)."""
    written: dict[bytes, AWSet] = {}
    for member in dict.fromkeys([*remove, *add]):
        state = element(head, rows[member], member)
        if member in remove:
            state = state.remove([member], version)
        if member in add:
            state = state.add([member], version, expires_at)
        written[member] = state
    # The head: the operation's version, and the touched members' legacy entries dropped.
    return AWSet(updated=version) if head is None else head.remove(written, version), written


def members(head: AWSet | None, rows: Iterable[tuple[bytes, AWSet]], now_ms: int) -> list[bytes]:
    """The visible members of a set: its rows (in member order) and what a legacy head holds of
    members without a row."""
    seen: set[bytes] = set()
    found: list[bytes] = []
    for member, row in rows:
        seen.add(member)
        if element(head, row, member).members(now_ms):
            found.append(member)
    if head is not None:
        found.extend(m for m in head.members(now_ms) if m not in seen)
    return sorted(found)
