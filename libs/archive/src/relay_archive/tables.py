"""The tables a rebuild writes and an export writes, so that verify compares like with like:
queues, messages, retained messages and uncertain requests, each one Parquet schema, and the
cut (where in the log a state stands) as JSON.

Invariant: the Spark jobs and the plain-Python rebuild write the same schemas from the same
`relay_archive.replay` values (`*_rows`); an export writes the same columns, with the log
positions it does not know as nulls.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relay_archive import replay, standing

QUEUES = pa.schema(
    [
        pa.field("queue", pa.string(), nullable=False),
        pa.field("sender", pa.string(), nullable=False),
        pa.field("recipient_key", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
    ]
)
MESSAGES = pa.schema(
    [
        pa.field("queue", pa.string(), nullable=False),
        pa.field("msg_id", pa.string(), nullable=False),
        pa.field("ts", pa.int64()),
        pa.field("expires_ms", pa.int64()),
        pa.field("body", pa.string(), nullable=False),
        pa.field("quota", pa.bool_(), nullable=False),
        pa.field("command", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
    ]
)
RETAINED = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("payload", pa.string(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("expires_ms", pa.int64()),
        pa.field("request", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
    ]
)
STREAMS = pa.schema(
    [
        pa.field("db", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("payload", pa.string(), nullable=False),
        pa.field("request", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
    ]
)
UNCERTAIN = pa.schema(
    [
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("command", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("msg_id", pa.string(), nullable=False),
    ]
)
SCHEMAS = {
    "queues": QUEUES,
    "messages": MESSAGES,
    "retained": RETAINED,
    "streams": STREAMS,
    "uncertain": UNCERTAIN,
}


def _offsets(data: dict[str, Any] | None) -> dict[int, int] | None:
    return None if data is None else {int(k): int(v) for k, v in data.items()}


def _per_partition(data: dict[str, Any] | None) -> dict[int, dict[str, int]]:
    return {int(p): {str(k): int(v) for k, v in by.items()} for p, by in (data or {}).items()}


@dataclass(frozen=True)
class Cut:
    """Where a state stands in the log: per command partition, the first offset not applied
    (None: everything archived), and the wall-clock time the state was taken (expiry).

    For the publications (retained messages and durable streams), a bounded cut: per
    partition, every record before `publications[p]` applied and none at or past
    `publications_upto[p]`; those in between were in flight when the retainer's copy was
    taken and may or may not be in it, so a rebuild counts them as unanswered (uncertain).
    None: every archived publication (an offline export of a stopped retainer).

    `stores` makes it exact where known: per partition, per store of the retainer (the
    retained store, each stream shard), the first offset whose write that store does not hold,
    read from the marks the stores keep in their write batches; `shards` places a stream
    message in its shard (`relay_archive.standing`).

    `resume`, for a cut of everything archived (no export): per publications partition, the
    first offset not archived (absent: nothing archived), so the rebuilt retained and stream
    state holds every record before it and none after; a restored retainer reads on from
    there (`relay_archive.restore`). None for a cut from an export."""

    epoch: str
    at_ms: int
    offsets: dict[int, int] | None = None
    publications: dict[int, int] | None = None
    publications_upto: dict[int, int] | None = None
    stores: dict[int, dict[str, int]] = field(default_factory=dict)
    shards: dict[int, dict[str, int]] = field(default_factory=dict)
    resume: dict[int, int] | None = None

    def publication_cut(self) -> standing.PublicationCut:
        return standing.PublicationCut(
            self.publications, self.publications_upto, self.stores, self.shards
        )

    def to_json(self) -> str:
        data = asdict(self)
        for name in ("offsets", "publications", "publications_upto", "stores", "shards", "resume"):
            value = getattr(self, name)
            if value is not None:
                data[name] = {str(k): v for k, v in sorted(value.items())}
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Cut:
        data = json.loads(text)
        return Cut(
            str(data["epoch"]),
            int(data["at_ms"]),
            _offsets(data.get("offsets")),
            _offsets(data.get("publications")),
            _offsets(data.get("publications_upto")),
            _per_partition(data.get("stores")),
            _per_partition(data.get("shards")),
            _offsets(data.get("resume")),
        )


def queue_rows(state: replay.QueueState) -> list[dict[str, Any]]:
    return [
        {"queue": q.queue, "sender": q.sender, "recipient_key": q.recipient_key, "status": q.status}
        for q in sorted(state.queues.values(), key=lambda q: q.queue)
    ]


def message_rows(state: replay.QueueState) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in asdict(m).items() if k in MESSAGES.names} for m in state.all_messages()
    ]


def retained_rows(state: replay.RetainedState) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in asdict(m).items() if k in RETAINED.names}
        for m in sorted(state.topics.values(), key=lambda m: m.topic)
    ]


def stream_rows(state: replay.StreamState) -> list[dict[str, Any]]:
    """Sorted by (db, topic, ts, payload): the order a store's replay has no say in."""
    return sorted(
        (asdict(m) for m in state.messages),
        key=lambda r: (r["db"], r["topic"], r["ts"], r["payload"]),
    )


def uncertain_rows(uncertain: list[replay.Uncertain]) -> list[dict[str, Any]]:
    return [asdict(u) for u in sorted(uncertain, key=lambda u: (u.partition, u.offset))]


def write_table(folder: Path, name: str, rows: list[dict[str, Any]], part: str = "part-0") -> None:
    """`<folder>/<name>/<part>.parquet` (a folder per table, as Spark writes them)."""
    target = folder / name
    target.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SCHEMAS[name])
    pq.write_table(table, target / f"{part}.parquet", compression="zstd")


def read_table(folder: Path, name: str) -> pa.Table:
    """Every part of a table written by `write_table` or by Spark (empty if there is none)."""
    target = folder / name
    parts = sorted(target.glob("*.parquet")) if target.is_dir() else []
    if not parts:
        return SCHEMAS[name].empty_table()
    tables = [pq.read_table(p).select(SCHEMAS[name].names) for p in parts]
    return pa.concat_tables([t.cast(SCHEMAS[name]) for t in tables])
