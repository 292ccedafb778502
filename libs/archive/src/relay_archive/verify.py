"""Verify: the rebuilt state against a live export, every difference classified, and whether
the archive itself is whole.

Classes:
- MISSING: rebuilt from acknowledged commands, absent live: a durability violation (BRIEF §4);
- EXTRA: live, but no acknowledged command made it;
- MISMATCH: on both sides with different content;
- EXPLAINED: a difference with a reason that is not an error: an uncertain (unanswered)
  command touches it, or it expires at or before the cut's time.

Invariants: every difference gets exactly one class, decided by the pure `classify_*`
functions (the Spark job calls them on the rows its joins leave; the Python path on every row);
equal rows produce nothing. The exit code is 2 when the archive has gaps or damaged files (no
verdict is possible), else 1 when any MISSING, EXTRA or MISMATCH exists, else 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from relay_archive import layout, reader, tables
from relay_archive.store import ArchiveStore, CorruptArchiveFile
from relay_bus import topics

MISSING, EXTRA, MISMATCH, EXPLAINED = "MISSING", "EXTRA", "MISMATCH", "EXPLAINED"
ERRORS = (MISSING, EXTRA, MISMATCH)
Row = dict[str, Any]


@dataclass(frozen=True)
class Difference:
    what: str
    """`queue`, `message`, `retained` or `stream`."""
    key: str
    klass: str
    reason: str
    rebuilt: Row | None = None
    live: Row | None = None


@dataclass(frozen=True)
class Uncertainty:
    """What unanswered commands may have changed: only those, not every difference near them
    (an unanswered read must not hide a lost message)."""

    msg_ids: frozenset[str] = frozenset()
    """Messages an unanswered send or ack names."""
    queues: frozenset[str] = frozenset()
    """Queues (or senders) an unanswered create, suspend or delete names."""
    deleted: frozenset[str] = frozenset()
    """Queues an unanswered delete names: all their messages may be gone."""
    topics: frozenset[str] = frozenset()
    """Retained topics an unanswered publish or delete names."""
    stream_dbs: frozenset[str] = frozenset()
    """Durable-stream databases an unanswered write names (its messages may be stored)."""

    @staticmethod
    def of(rows: list[Row]) -> Uncertainty:
        def subjects(*ops: str) -> frozenset[str]:
            return frozenset(r["subject"] for r in rows if r["op"] in ops)

        return Uncertainty(
            msg_ids=frozenset(r["msg_id"] for r in rows if r["msg_id"]),
            queues=subjects("create", "suspend", "delete"),
            deleted=subjects("delete"),
            topics=subjects("retain"),
            stream_dbs=subjects("stream"),
        )


def _expired(row: Row | None, at_ms: int) -> bool:
    return row is not None and row.get("expires_ms") is not None and row["expires_ms"] <= at_ms


def classify_message(
    rebuilt: Row | None, live: Row | None, uncertain: Uncertainty, at_ms: int
) -> Difference | None:
    either = rebuilt or live
    assert either is not None
    key = either["msg_id"]
    if rebuilt is not None and live is not None:
        fields = ["queue", "body", "quota"] + ([] if rebuilt["quota"] else ["ts"])
        if all(rebuilt[f] == live[f] for f in fields):
            return None
        changed = [f for f in fields if rebuilt[f] != live[f]]
        klass, reason = MISMATCH, "differs in " + ", ".join(changed)
    elif rebuilt is not None:
        klass, reason = MISSING, "acknowledged send absent live"
    else:
        klass, reason = EXTRA, "live message no acknowledged send made"
    if key in uncertain.msg_ids or either["queue"] in uncertain.deleted:
        klass, reason = EXPLAINED, f"uncertain command ({reason})"
    elif _expired(rebuilt, at_ms) or _expired(live, at_ms):
        klass, reason = EXPLAINED, f"expires at the cut ({reason})"
    return Difference("message", key, klass, reason, rebuilt, live)


def classify_queue(
    rebuilt: Row | None, live: Row | None, uncertain: Uncertainty
) -> Difference | None:
    either = rebuilt or live
    assert either is not None
    if rebuilt is not None and live is not None:
        changed = [f for f in ("sender", "recipient_key", "status") if rebuilt[f] != live[f]]
        if not changed:
            return None
        klass, reason = MISMATCH, "differs in " + ", ".join(changed)
    elif rebuilt is not None:
        klass, reason = MISSING, "acknowledged queue absent live"
    else:
        klass, reason = EXTRA, "live queue no acknowledged create made"
    if either["queue"] in uncertain.queues or either["sender"] in uncertain.queues:
        klass, reason = EXPLAINED, f"uncertain command ({reason})"
    return Difference("queue", either["queue"], klass, reason, rebuilt, live)


def classify_retained(
    rebuilt: Row | None, live: Row | None, uncertain: Uncertainty, at_ms: int
) -> Difference | None:
    either = rebuilt or live
    assert either is not None
    if rebuilt is not None and live is not None:
        changed = [f for f in ("payload", "ts", "expires_ms") if rebuilt[f] != live[f]]
        if not changed:
            return None
        klass, reason = MISMATCH, "differs in " + ", ".join(changed)
    elif rebuilt is not None:
        klass, reason = MISSING, "acknowledged retained message absent live"
    else:
        klass, reason = EXTRA, "live retained message no acknowledged publish made"
    if either["topic"] in uncertain.topics:
        klass, reason = EXPLAINED, f"uncertain publish ({reason})"
    elif _expired(rebuilt, at_ms) or _expired(live, at_ms):
        klass, reason = EXPLAINED, f"expires at the cut ({reason})"
    return Difference("retained", either["topic"], klass, reason, rebuilt, live)


STREAM_KEY = ("db", "topic", "ts", "payload")
"""A stream message's identity: a store keeps every copy written, so copies are counted."""


def classify_stream(
    message: Row, rebuilt: int, live: int, uncertain: Uncertainty
) -> Difference | None:
    """`message` (its `STREAM_KEY` fields) held `rebuilt` times by the rebuild, `live` times
    live. Fewer live than acknowledged is MISSING; more live is EXTRA, unless an unanswered
    write to that database may have stored them."""
    if rebuilt == live:
        return None
    key = f"{message['db']}/{message['topic']}@{message['ts']}"
    mine = {**message, "count": rebuilt} if rebuilt else None
    theirs = {**message, "count": live} if live else None
    if rebuilt > live:
        reason = f"{rebuilt} acknowledged, {live} live"
        return Difference("stream", key, MISSING, reason, mine, theirs)
    if message["db"] in uncertain.stream_dbs:
        reason = f"uncertain write ({live} live, {rebuilt} acknowledged)"
        return Difference("stream", key, EXPLAINED, reason, mine, theirs)
    reason = f"{live} live, {rebuilt} acknowledged"
    return Difference("stream", key, EXTRA, reason, mine, theirs)


def _stream_counts(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple(row[f] for f in STREAM_KEY) for row in table.select(STREAM_KEY).to_pylist()
    )


def _by(table: pa.Table, key: str) -> dict[str, Row]:
    return {row[key]: row for row in table.to_pylist()}


def compare(
    rebuilt: dict[str, pa.Table], live: dict[str, pa.Table], at_ms: int
) -> list[Difference]:
    """Every difference between two sets of tables (`relay_archive.tables`), in key order."""
    uncertain = Uncertainty.of(rebuilt["uncertain"].to_pylist())
    found: list[Difference | None] = []

    def queue(r: Row | None, lv: Row | None) -> Difference | None:
        return classify_queue(r, lv, uncertain)

    def message(r: Row | None, lv: Row | None) -> Difference | None:
        return classify_message(r, lv, uncertain, at_ms)

    def retained(r: Row | None, lv: Row | None) -> Difference | None:
        return classify_retained(r, lv, uncertain, at_ms)

    pairs: list[tuple[str, str, Callable[[Row | None, Row | None], Difference | None]]] = [
        ("queues", "queue", queue),
        ("messages", "msg_id", message),
        ("retained", "topic", retained),
    ]
    for name, key, classify in pairs:
        mine, theirs = _by(rebuilt[name], key), _by(live[name], key)
        for k in sorted(mine.keys() | theirs.keys()):
            found.append(classify(mine.get(k), theirs.get(k)))
    none = tables.STREAMS.empty_table()
    mine_streams = _stream_counts(rebuilt.get("streams", none))
    live_streams = _stream_counts(live.get("streams", none))
    for held in sorted(mine_streams.keys() | live_streams.keys()):
        row = dict(zip(STREAM_KEY, held, strict=True))
        found.append(classify_stream(row, mine_streams[held], live_streams[held], uncertain))
    return [d for d in found if d is not None]


@dataclass
class ArchiveHealth:
    gaps: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    """Topic → (partition, first, last) ranges the archive lacks; last -1: the partition has
    no readable file at all."""
    corrupt: list[str] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return not self.gaps and not self.corrupt


def check_archive(store: ArchiveStore, cut: tables.Cut) -> ArchiveHealth:
    """Gaps and damaged files of the cut's epoch: every archived partition must be covered from
    offset 0 (the archiver starts a new epoch there) without holes, and every command partition
    the cut names up to its cut. (A partition with no file at all is told apart from an empty
    one only where the cut names it: the archive alone does not know Kafka's partitions.)"""
    health = ArchiveHealth()
    for topic in (topics.QUEUE_COMMANDS, topics.PUBLICATIONS, topics.INGRESS_INBOX):
        folder = f"{layout.LAYOUT}/epoch={cut.epoch}/topic={topic}"
        readable: list[layout.ArchiveFile] = []
        for f in store.list_files(folder):
            try:
                store.read(f, columns=["offset"])
                readable.append(f)
            except CorruptArchiveFile as error:
                health.corrupt.append(error.path)
        coverage = {s.partition: layout.coverage(fs) for s, fs in reader.by_slot(readable).items()}
        gaps = [(p, a, b) for p, c in coverage.items() if c is not None for a, b in c.gaps]
        gaps += [(p, 0, c.first - 1) for p, c in coverage.items() if c is not None and c.first > 0]
        ends = dict(cut.offsets or {}) if topic == topics.QUEUE_COMMANDS else {}
        for partition, end in sorted(ends.items()):
            c = coverage.get(partition)
            if c is None and end > 0:
                gaps.append((partition, 0, -1))
            elif c is not None and c.last < end - 1:
                gaps.append((partition, c.last + 1, end - 1))
        # a damaged file's range is a hole: the files listed beside it no longer cover it
        if gaps:
            health.gaps[topic] = sorted(set(gaps))
    return health


def exit_code(health: ArchiveHealth, differences: list[Difference]) -> int:
    if not health.whole:
        return 2
    return 1 if any(d.klass in ERRORS for d in differences) else 0


def counts(differences: list[Difference]) -> dict[str, int]:
    found = Counter(d.klass for d in differences)
    return {k: found.get(k, 0) for k in (*ERRORS, EXPLAINED)}
