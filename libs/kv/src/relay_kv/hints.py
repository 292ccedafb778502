"""Hinted handoff: what a fallback keeps for an unreachable home replica, and its limits.

A hint is one key's value for one target site. Hints for the same (target, namespace, key) are
merged into one (values are CRDTs), so a fallback holds at most one hint per key and target,
however many writes it saw. A fallback refuses a new hint past `max_bytes` held, and drops
hints older than `max_age_ms` (anti-entropy repairs what they carried). Replay goes oldest first
to the target once it answers again, paced by the target's answers (one batch at a time).

Invariant: `merge_hint` is the value merge, keeping the earliest `created_ms` (the age that
counts against `max_age_ms` is the oldest write the hint carries).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from relay_kv import codec, crdt

SEP = b"\0"


@dataclass(frozen=True)
class HintLimits:
    max_bytes: int = 64 << 20  # 64 MiB per fallback
    max_age_ms: int = 3 * 3600 * 1000  # 3 h (Cassandra's max_hint_window)


@dataclass(frozen=True)
class Hint:
    target: str
    n: int
    """The namespace's replication factor (where the value is kept on the target)."""
    namespace: str
    key: str
    value: crdt.Value
    created_ms: int

    def storage_key(self) -> bytes:
        return hint_key(self.target, self.namespace, self.key)

    def encode(self) -> bytes:
        return json.dumps(
            {"f": 1, "c": self.created_ms, "n": self.n, "v": codec.to_json(self.value)},
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, storage_key: bytes, data: bytes) -> Hint:
        target, namespace, key = storage_key.split(SEP, 2)
        raw = json.loads(data)
        if raw.get("f") != 1:
            raise codec.CorruptValue(f"unknown hint format {raw.get('f')!r}")
        return cls(
            target.decode(),
            int(raw["n"]),
            namespace.decode(),
            key.decode(),
            codec.from_json(raw["v"]),
            int(raw["c"]),
        )

    def expired(self, now_ms: int, limits: HintLimits) -> bool:
        return now_ms - self.created_ms > limits.max_age_ms


def hint_key(target: str, namespace: str, key: str) -> bytes:
    return SEP.join((target.encode(), namespace.encode(), key.encode()))


def merge_hint(old: Hint | None, new: Hint) -> Hint:
    if old is None:
        return new
    return Hint(
        new.target,
        new.n,
        new.namespace,
        new.key,
        crdt.merge(old.value, new.value),
        min(old.created_ms, new.created_ms),
    )


def admit(held_bytes: int, size: int, limits: HintLimits) -> bool:
    return held_bytes + size <= limits.max_bytes
