"""Restore: a new queue-writer or retainer data dir written from a rebuild, through the
engines (never by writing their files), with the marks that let the service go on from Kafka.

Queue-writer instance `k` of `n` gets the rebuilt queues whose partition `p` has `p mod n ==
k`: each queue record in the store log (active or suspended), its messages in the order their
sends were applied (partition and offset) with their ts and expiry, and, per owned partition,
the journal mark `<epoch>:<cut offset>` the queue-writer resumes from: commands before the cut
are in the restored state, commands after it are read from Kafka as usual. A retainer gets the
rebuilt retained messages of its partitions, with their ts and expiry, and, when the rebuild
took everything archived (no export: the cut's `resume`), `resume.json`: per partition it
owns, the first offset the rebuild did not hold (0 where nothing was archived). Before its
consumer reads, the retainer sets its group's committed offsets to them and removes the file,
so it reads on from exactly where its restored stores end; if its group had committed past
one (the lost retainer applied records the archive did not hold yet: the archiver lags by up
to a roll age), it refuses to start instead, since reading those again could not apply them
(`relay_retainer.resume`). It also gets the rebuilt
durable-stream messages of its partitions (each row's `partition` is the Kafka partition its
`store` request came on, which is the topic's: `partition_of_topic`), written through the
stream engine (`StreamStore.store_batch`, each message with its own ts), per database, into
databases created with `stream_shards` shards (the retainer's `RELAY_STREAMS__SHARDS`).

Caveat (retainer): a rebuild from an export has no `resume` (its cut is per store, not one
offset per partition): that retainer reads on from its group's committed offsets.

Invariants: a restore writes only into a data dir that holds no journal, store log, retained
store or stream store (`RestoreError` before anything is written otherwise); everything
written is durable when it returns (the engines' own fsyncs, then a store-log dump). Not
restored: quota markers (the journal appends one only when a send is refused at the quota;
counted in the result), the queue-writer's memory of recent msg_ids (a SEND put on Kafka
twice across the cut is kept once by the cut itself), and the stream store's site id (a new
one is made, as for any new volume).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay_archive import tables
from relay_durable import codec
from relay_durable.appendlog import fsync_dir
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import ids
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings
from relay_streams import files
from relay_streams.errors import CorruptRecord
from relay_streams.model import Message
from relay_streams.retained import RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore


class RestoreError(Exception):
    pass


@dataclass(frozen=True)
class Restored:
    queues: int = 0
    messages: int = 0
    quota_markers_skipped: int = 0
    retained: int = 0
    marks: dict[int, int] | None = None
    """Per partition, where the service reads on: a queue-writer's journal marks, a retainer's
    resume points (None: none written)."""
    streams: int = 0
    """Durable-stream messages written."""


RESUME_FILE = "resume.json"


@dataclass(frozen=True)
class Resume:
    """Where a restored retainer reads `relay.publications` on: per partition restored, the
    first offset its stores do not hold, in the log of `epoch`."""

    epoch: str
    offsets: dict[int, int]


def read_resume(data_dir: Path) -> Resume | None:
    """The data dir's `resume.json`, if a restore left one (`RestoreError` if unreadable)."""
    path = data_dir / RESUME_FILE
    if not path.exists():
        return None
    try:
        data = files.read_json(path)
        offsets = {int(p): int(o) for p, o in data["offsets"].items()}
        return Resume(str(data["epoch"]), offsets)
    except (CorruptRecord, KeyError, TypeError, ValueError, AttributeError) as error:
        raise RestoreError(f"{path}: not a resume record ({error})") from None


def resumed(data_dir: Path) -> None:
    """The resume points are committed: the file goes (durably)."""
    (data_dir / RESUME_FILE).unlink(missing_ok=True)
    fsync_dir(data_dir)


def _owned(partition: int, ordinal: int, replicas: int) -> bool:
    return partition % replicas == ordinal


def _refuse_if_used(*paths: Path) -> None:
    for path in paths:
        if path.exists() and any(path.iterdir()):
            raise RestoreError(f"{path} is not empty: restore writes a new data dir only")


def read_cut(rebuilt: Path) -> tables.Cut:
    try:
        return tables.Cut.from_json((rebuilt / "cut.json").read_text())
    except (OSError, ValueError, KeyError) as error:
        raise RestoreError(f"{rebuilt}: not a rebuild (cut.json: {error})") from None


def restore_queue_writer(
    rebuilt: Path, data_dir: Path, ordinal: int, replicas: int, partitions: int
) -> Restored:
    if not 0 <= ordinal < replicas:
        raise RestoreError(f"ordinal {ordinal} is not in 0..{replicas - 1}")
    cut = read_cut(rebuilt)
    _refuse_if_used(data_dir / "journal", data_dir / "store")
    queues = [
        q
        for q in tables.read_table(rebuilt, "queues").to_pylist()
        if _owned(ids.partition_of(q["queue"], partitions), ordinal, replicas)
    ]
    owned = {q["queue"] for q in queues}
    messages = sorted(
        (m for m in tables.read_table(rebuilt, "messages").to_pylist() if m["queue"] in owned),
        key=lambda m: (m["partition"], m["offset"]),
    )
    journal = QueueJournal(JournalSettings(root=data_dir / "journal"))
    try:
        store = StoreLog(StoreLogSettings(root=data_dir / "store"))
        try:
            quota = journal.settings.max_queue_messages
            for q in queues:
                record = QueueRecord(
                    q["queue"], q["sender"], q["recipient_key"], quota, cut.at_ms, cut.at_ms
                )
                store.new(record)
            written = skipped = 0
            for m in messages:
                if m["quota"]:
                    skipped += 1
                    continue
                journal.write(
                    m["queue"],
                    ids.id_bytes(m["msg_id"]),
                    codec.unb64u(m["body"]),
                    ts_ms=m["ts"],
                    expires_ms=m["expires_ms"] or 0,
                )
                written += 1
            for q in queues:
                if q["status"] == "suspended":
                    journal.suspend(q["queue"])
                    store.set_status(q["queue"], "suspended", cut.at_ms)
            marks = {
                p: offset
                for p, offset in (cut.offsets or {}).items()
                if _owned(p, ordinal, replicas)
            }
            for partition, offset in sorted(marks.items()):
                journal.mark(f"p{partition}", f"{cut.epoch}:{offset}", alone=True)
            journal.sync()
            store.dump()
            store.wait_dump()
        finally:
            store.close()
    finally:
        journal.close()
    return Restored(len(queues), written, skipped, 0, marks)


STREAM_BATCH = 1000
"""Messages per `store_batch` call of a stream restore."""


def restore_retainer(
    rebuilt: Path,
    data_dir: Path,
    ordinal: int,
    replicas: int,
    stream_shards: int = 4,
    partitions: int = 8,
) -> Restored:
    """Retained messages and durable-stream messages of this retainer's partitions (each row's
    `partition`, computed by the rebuild, is the Kafka partition its request came from), and
    their resume points when the cut has them (`partitions`: of `relay.publications`)."""
    if not 0 <= ordinal < replicas:
        raise RestoreError(f"ordinal {ordinal} is not in 0..{replicas - 1}")
    if stream_shards < 1:
        raise RestoreError(f"stream shards must be at least 1, got {stream_shards}")
    cut = read_cut(rebuilt)
    _refuse_if_used(data_dir / "retained", data_dir / "streams")
    rows = [
        r
        for r in tables.read_table(rebuilt, "retained").to_pylist()
        if _owned(r["partition"], ordinal, replicas)
    ]
    streams = [
        r
        for r in tables.read_table(rebuilt, "streams").to_pylist()
        if _owned(r["partition"], ordinal, replicas)
    ]
    (data_dir / "retained").mkdir(parents=True, exist_ok=True)
    with RetainedStore(data_dir / "retained") as store:
        writes = []
        for r in rows:
            expiry = None
            if r["expires_ms"] is not None:
                expiry = max(1, (r["expires_ms"] - r["ts"]) // 1000)
            writes.append(Write(r["topic"], codec.unb64u(r["payload"]), 0, expiry, r["ts"]))
        for start in range(0, len(writes), 1000):
            store.store_many(writes[start : start + 1000])
    _restore_streams(streams, data_dir / "streams", stream_shards)
    marks = None
    if cut.resume is not None:
        marks = {p: cut.resume.get(p, 0) for p in range(partitions) if _owned(p, ordinal, replicas)}
        offsets = {str(p): offset for p, offset in marks.items()}
        files.write_json(data_dir / RESUME_FILE, {"epoch": cut.epoch, "offsets": offsets})
    return Restored(retained=len(rows), streams=len(streams), marks=marks)


def _restore_streams(rows: list[dict[str, Any]], root: Path, shards: int) -> None:
    """Every row through the stream engine, in the order the rebuild applied them (partition,
    offset), each `store_batch` durable before the next."""
    by_db: dict[str, list[Message]] = {}
    for r in sorted(rows, key=lambda r: (r["partition"], r["offset"] or 0)):
        by_db.setdefault(r["db"], []).append(
            Message(r["topic"], codec.unb64u(r["payload"]), r["ts"])
        )
    store = StreamStore(root)
    try:
        for db, messages in sorted(by_db.items()):
            store.open_db(db, None if db in store.list_dbs() else DbSettings(shards=shards))
            for start in range(0, len(messages), STREAM_BATCH):
                store.store_batch(db, messages[start : start + STREAM_BATCH], sync=True)
    finally:
        store.close()
