"""One archived Kafka record as a row: the Parquet schema of every archive file.

Each row keeps the exact record bytes (`value`) beside the fields a job filters or joins on
without parsing them: `kind`, `v` and the request `id` of Relay records (`relay_bus.schemas`).

Invariants:
- `row_of` never refuses a record: one that is not a Relay JSON object (or has no `id`) gets
  empty `kind`/`id` and `v` 0, and its bytes are kept all the same, so the archive is the log;
- the schema is versioned with the layout (`relay_archive.layout.LAYOUT`); a change of column
  type is a new layout version, new columns are added at the end and nullable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("v", pa.int32(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
    ]
)
"""`offset` and `timestamp_ms` are Kafka's (the timestamp is the producer's create time);
`id` is the request or command id, empty when the record has none."""


@dataclass(frozen=True)
class Row:
    offset: int
    timestamp_ms: int
    key: bytes | None
    kind: str
    v: int
    id: str
    value: bytes

    @property
    def size(self) -> int:
        """Approximate bytes in memory and on disk before compression."""
        return 40 + len(self.value) + len(self.key or b"") + len(self.kind) + len(self.id)


def row_of(offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None) -> Row:
    data = value or b""
    kind, v, request_id = "", 0, ""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        found_kind, found_v, found_id = parsed.get("kind"), parsed.get("v"), parsed.get("id")
        kind = found_kind if isinstance(found_kind, str) else ""
        v = found_v if type(found_v) is int and 0 <= found_v < 2**31 else 0
        request_id = found_id if isinstance(found_id, str) else ""
    return Row(offset, timestamp_ms, key, kind, v, request_id, data)


def table_of(rows: list[Row]) -> pa.Table:
    return pa.table(
        {
            "offset": pa.array([r.offset for r in rows], pa.int64()),
            "timestamp_ms": pa.array([r.timestamp_ms for r in rows], pa.int64()),
            "key": pa.array([r.key for r in rows], pa.binary()),
            "kind": pa.array([r.kind for r in rows], pa.string()),
            "v": pa.array([r.v for r in rows], pa.int32()),
            "id": pa.array([r.id for r in rows], pa.string()),
            "value": pa.array([r.value for r in rows], pa.binary()),
        },
        schema=SCHEMA,
    )
