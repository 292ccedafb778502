"""Per-database settings: what `open_db` takes and `db.json` records.

Invariant: a `DbSettings` is valid once built (`__post_init__` raises `BadInput` otherwise), so
nothing downstream re-checks it. `shards` is fixed when the database is created; the others
may change at a later `open_db` and apply from then on (a new layout or new thresholds from the
next generation, since a generation keeps the layout it was created with).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from relay_streams.errors import BadInput
from relay_streams.layouts import known_layout

MAX_SHARDS = 1024


@dataclass(frozen=True)
class DbSettings:
    shards: int = 4
    """Shards (one RocksDB instance each, `shard-<i>/`); a topic's shard is crc32(topic) mod
    shards. Fixed at creation: changing it would move topics between shards."""
    layout: str = "lts/1"
    """Layout of new generations, `<name>/<version>`: `lts/1` (learned topic structure, many
    streams) or `reference/1` (one stream per shard)."""
    lts_thresholds: tuple[int, ...] = (100, 20)
    """Distinct concrete children a trie node at depth i (0 = first topic level) may have
    before further ones go through its `+` edge; the last value applies to deeper levels."""
    egress_batch_size: int = 1000  # messages
    """Buffered messages of `store_batch(sync=False)` that trigger a write before the interval."""
    egress_flush_interval_ms: float = 100.0  # ms
    """Longest time a `store_batch(sync=False)` message waits in the buffer."""

    def __post_init__(self) -> None:
        if not isinstance(self.shards, int) or not 1 <= self.shards <= MAX_SHARDS:
            raise BadInput(f"shards must be an integer in 1..{MAX_SHARDS}, got {self.shards!r}")
        known_layout(self.layout)
        thresholds = self.lts_thresholds
        if (
            not isinstance(thresholds, tuple)
            or not thresholds
            or not all(isinstance(t, int) and t >= 1 for t in thresholds)
        ):
            raise BadInput(f"lts_thresholds must be positive integers, got {thresholds!r}")
        if not isinstance(self.egress_batch_size, int) or self.egress_batch_size < 1:
            raise BadInput(f"egress_batch_size must be >= 1, got {self.egress_batch_size!r}")
        interval = self.egress_flush_interval_ms
        if not isinstance(interval, int | float) or not 0 < interval <= 60_000:
            raise BadInput(f"egress_flush_interval_ms must be in (0, 60000], got {interval!r}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["lts_thresholds"] = list(self.lts_thresholds)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DbSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise BadInput(f"unknown database settings {unknown}; known: {sorted(known)}")
        values = dict(data)
        if "lts_thresholds" in values:
            thresholds = values["lts_thresholds"]
            if not isinstance(thresholds, list):
                raise BadInput(f"lts_thresholds must be a list, got {thresholds!r}")
            values["lts_thresholds"] = tuple(thresholds)
        return cls(**values)

    def layout_options(self) -> dict[str, Any]:
        """Options a new generation records with its layout."""
        if self.layout.startswith("lts/"):
            return {"thresholds": list(self.lts_thresholds)}
        return {}
