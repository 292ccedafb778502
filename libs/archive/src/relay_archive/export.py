"""Live state written as tables for verify: a stopped queue-writer's or retainer's data dir,
read through its own engines (never by parsing their files), as of its position in the log.

The queue-writer's position is exact: before applying a command it marks `<epoch>:<next
offset>` per partition in its journal, in order with the changes (`relay_queue_writer.commands`),
so the marks are the cut. The retainer's stores keep marks in the batches of their writes
(`relay_streams.marks`), which an online export reads with the data, from stores opened
read-only while the retainer goes on writing (`export_retainer_part`); an offline export of a
stopped retainer is taken as of everything it read, which for one that had caught up is the
archive's end.

Invariants: an export never changes what the engines hold beyond what opening them does (the
recovery every start runs); a data dir whose marks name two epochs is refused
(`ExportError`), since no single cut describes it; a folder that is not such a data dir is
refused before anything is opened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from relay_archive import standing, tables
from relay_durable import codec
from relay_journal.journal import QueueJournal
from relay_journal.records import Message
from relay_journal.settings import JournalSettings
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings
from relay_streams.retained import RetainedStore
from relay_streams.store import StreamStore

PAGE = 10_000
"""Messages read per `next` call of a stream export."""

CUT_FILE = "cut-{name}.json"


class ExportError(Exception):
    pass


def export_queue_writer(data_dir: Path, out: Path, name: str, at_ms: int) -> tables.Cut:
    """Write `<out>/queues/<name>.parquet`, `<out>/messages/<name>.parquet` and the cut."""
    if not (data_dir / "journal").is_dir() or not (data_dir / "store").is_dir():
        raise ExportError(f"{data_dir}: not a queue-writer data dir (no journal/ and store/)")
    journal = QueueJournal(JournalSettings(root=data_dir / "journal"))
    try:
        store = StoreLog(StoreLogSettings(root=data_dir / "store"))
        try:
            queues: list[dict[str, object]] = []
            messages: list[dict[str, object]] = []
            for record in sorted(store.queues.values()):
                queues.append(queue_row(record))
                messages.extend(
                    message_rows(record.recipient_id, journal.messages(record.recipient_id))
                )
            marks = dict(journal.marks)
        finally:
            store.close()
    finally:
        journal.close()
    epochs, offsets = set(), {}
    for key, value in marks.items():
        epoch, _, offset = value.partition(":")
        if key.startswith("p") and key[1:].isdigit() and offset.isdigit():
            epochs.add(epoch)
            offsets[int(key[1:])] = int(offset)
    if len(epochs) > 1:
        raise ExportError(f"{data_dir}: marks of several broker epochs {sorted(epochs)}")
    cut = tables.Cut(epochs.pop() if epochs else "", at_ms, offsets)
    write_queue_part(out, name, queues, messages, cut)
    return cut


def write_queue_part(
    out: Path,
    name: str,
    queues: list[dict[str, object]],
    messages: list[dict[str, object]],
    cut: tables.Cut,
) -> None:
    """One queue-writer's part of an export: `<out>/queues/<name>.parquet`,
    `<out>/messages/<name>.parquet` and `<out>/cut-<name>.json`."""
    tables.write_table(out, "queues", queues, name)
    tables.write_table(out, "messages", messages, name)
    (out / CUT_FILE.format(name=name)).write_text(cut.to_json())


def queue_row(record: QueueRecord) -> dict[str, object]:
    """A store-log queue record as a row of `tables.QUEUES`."""
    return {
        "queue": record.recipient_id,
        "sender": record.sender_id,
        "recipient_key": record.recipient_key,
        "status": record.status,
    }


def message_rows(queue: str, messages: list[Message]) -> list[dict[str, object]]:
    """A queue's journal messages as rows of `tables.MESSAGES` (a quota marker has no ts)."""
    return [
        {
            "queue": queue,
            "msg_id": codec.b64u(m.msg_id),
            "ts": None if m.quota else m.ts_ms,
            "expires_ms": m.expires_ms or None,
            "body": codec.b64u(m.body),
            "quota": m.quota,
        }
        for m in messages
    ]


def export_retainer(data_dir: Path, out: Path, name: str) -> int:
    """Write `<out>/retained/<name>.parquet` (every retained message, expired ones included:
    verify explains them) and `<out>/streams/<name>.parquet` (every durable-stream message)
    of a stopped retainer's data dir; returns how many retained messages."""
    return export_retainer_part(data_dir, out, name, "", []).retained


@dataclass(frozen=True)
class RetainerPart:
    retained: int
    """Retained messages written."""
    streams: int
    """Stream messages written."""
    stores: dict[int, dict[str, int]]
    """The exact part of the cut (`tables.Cut.stores`): per partition, per store whose
    position is known, the first offset of the epoch whose write it does not hold."""
    shards: dict[int, dict[str, int]]
    """Per partition, each stream database's shard count (`tables.Cut.shards`)."""


def export_retainer_part(
    data_dir: Path,
    out: Path,
    name: str,
    epoch: str,
    partitions: list[int],
    read_only: bool = False,
) -> RetainerPart:
    """A retainer's part of an export: its retained messages and stream messages as
    `export_retainer` writes them, and each store's position read from the marks of the same
    open that read its data (`relay_streams.marks`), for `partitions` of log `epoch`. With
    `read_only`, the stores are opened as they stand while their owner goes on writing
    (`relay_streams.reading`): each store is then a point in time of its own, which its marks
    describe exactly."""
    if not (data_dir / "retained").is_dir():
        raise ExportError(f"{data_dir}: not a retainer data dir (no retained/)")
    stores: dict[int, dict[str, int]] = {p: {} for p in partitions}
    shards: dict[int, dict[str, int]] = {p: {} for p in partitions}
    rows = []
    with RetainedStore(data_dir / "retained", read_only=read_only) as store:
        for p, offset in store.marks.cut(epoch, partitions).items():
            stores[p][standing.RETAINED] = offset
        for message in store.every():  # `$` topics too, which `#` does not match
            rows.append(
                {
                    "topic": message.topic,
                    "payload": codec.b64u(message.payload),
                    "ts": message.ts,
                    "expires_ms": message.expires_at,
                }
            )
    tables.write_table(out, "retained", rows, name)
    streams = 0
    if (data_dir / "streams").is_dir():
        found = stream_rows(data_dir / "streams", epoch, partitions, stores, shards, read_only)
        tables.write_table(out, "streams", found, name)
        streams = len(found)
    return RetainerPart(len(rows), streams, stores, shards)


def stream_rows(
    root: Path,
    epoch: str = "",
    partitions: list[int] | None = None,
    stores: dict[int, dict[str, int]] | None = None,
    shards: dict[int, dict[str, int]] | None = None,
    read_only: bool = False,
) -> list[dict[str, object]]:
    """Every message of every database of a stream store (`relay_streams`), read through the
    store's unfiltered scan (`StreamStore.every_message`): topics whose first level starts
    with `$`, which a subscription's `#` does not match (MQTT), are exported like any other.
    With `stores`/`shards`, each shard's position for `partitions` of `epoch` and each
    database's shard count are added to them (`export_retainer_part`)."""
    store = StreamStore(root, read_only=read_only)
    stores = {} if stores is None else stores
    shards = {} if shards is None else shards
    rows: list[dict[str, object]] = []
    try:
        for db in store.list_dbs():
            opened = store.open_db(db)
            for shard, marks in enumerate(opened.marks()):
                for p, offset in marks.cut(epoch, partitions or []).items():
                    stores.setdefault(p, {})[standing.stream_store(db, shard)] = offset
            for p in partitions or []:
                shards.setdefault(p, {})[db] = len(opened.shards)
            for page in store.every_message(db, PAGE):
                rows.extend(
                    {"db": db, "topic": m.topic, "ts": m.ts, "payload": codec.b64u(m.payload)}
                    for m in page
                )
    finally:
        store.close()
    return rows


PUBLICATIONS_CUT_FILE = "publications-{name}.json"


def write_retainer_cut(out: Path, name: str, cut: tables.Cut) -> None:
    """A retainer's cut of the publications (`tables.Cut.publications*`, `stores`)."""
    (out / PUBLICATIONS_CUT_FILE.format(name=name)).write_text(cut.to_json())


def read_cut(out: Path, at_ms: int) -> tables.Cut:
    """The cut of a whole export, taken at `at_ms`: every queue-writer's command offsets and,
    for an online export, every retainer's publications cut (all of one epoch; the epoch is ""
    when no part names one)."""
    epochs, offsets = set(), {}
    lower: dict[int, int] | None = None
    upper: dict[int, int] | None = None
    stores: dict[int, dict[str, int]] = {}
    shards: dict[int, dict[str, int]] = {}
    for path in sorted(out.glob(CUT_FILE.format(name="*"))):
        cut = tables.Cut.from_json(path.read_text())
        if cut.epoch:
            epochs.add(cut.epoch)
        offsets.update(cut.offsets or {})
    for path in sorted(out.glob(PUBLICATIONS_CUT_FILE.format(name="*"))):
        cut = tables.Cut.from_json(path.read_text())
        epochs.add(cut.epoch)
        lower = {**(lower or {}), **(cut.publications or {})}
        upper = {**(upper or {}), **(cut.publications_upto or {})}
        stores.update(cut.stores)  # each retainer's partitions are its own
        shards.update(cut.shards)
    if len(epochs) > 1:
        raise ExportError(f"{out}: cuts name {len(epochs)} epochs ({sorted(epochs)}), need one")
    # No epoch: no owner had applied a command (an offline export of idle queue-writers); the
    # caller takes the archive's only epoch.
    return tables.Cut(epochs.pop() if epochs else "", at_ms, offsets, lower, upper, stores, shards)


EVERY_TABLE = ("queues", "messages", "retained", "streams")


def write_manifest(out: Path, at_ms: int, covers: tuple[str, ...] = EVERY_TABLE) -> None:
    """`export.json`: when the export was taken and which tables it holds (verify compares
    only those: a table an export does not hold is not a table of missing rows)."""
    manifest = {"at_ms": at_ms, "layout": 1, "covers": list(covers)}
    (out / "export.json").write_text(json.dumps(manifest))


def covered(out: Path) -> tuple[str, ...]:
    """The tables an export holds (every one for manifests written before `covers`)."""
    try:
        found = json.loads((out / "export.json").read_text()).get("covers")
    except (OSError, ValueError) as error:
        raise ExportError(f"{out}: not an export ({error})") from None
    if found is None:
        return EVERY_TABLE
    return tuple(name for name in EVERY_TABLE if name in found)


def read_manifest(out: Path) -> int:
    try:
        return int(json.loads((out / "export.json").read_text())["at_ms"])
    except (OSError, ValueError, KeyError) as error:
        raise ExportError(f"{out}: not an export ({error})") from None
