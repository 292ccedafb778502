"""One shard: a RocksDB instance (`shard-<i>/`) with one column family per generation.

Column families: `default` holds the shard's identity record and its marks (the log
positions its writes came from, `relay_streams.marks`; absent in a shard made before marks);
`gen-<N>` holds generation N:
its meta record `\\x00meta` (layout and options, as in `db.json`), its stats `\\x00stats`
(message count, time span, last sequence number), and the layout's records (`\\x01`...).

Invariants:
- every write is one RocksDB write batch with `sync=True` (WAL fdatasync'ed before it returns),
  and a generation's stats are in the same batch as the messages they count, so after any
  crash the stats match the data, and so are the shard's marks, so a copy's marks say
  exactly which records' writes it holds;
- a generation's column family is created before its meta record is written, and the meta
  record is written in one batch with the layout's initial records; a column family without
  a meta record is a creation that a crash interrupted, and is finished on open;
- dropping a generation drops its column family, which frees its files as a whole;
- only this module and the layouts touch RocksDB; the database serialises writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from rocksdict import ColumnFamily, Options, Rdict, WriteBatch, WriteOptions

from relay_ds.tokens import GenerationId, ShardId
from relay_streams import catalog, checkpoints, marks, reading
from relay_streams.errors import CorruptRecord, WriteFailed
from relay_streams.layouts import base, layout_module
from relay_streams.marks import Mark, Marks
from relay_streams.model import Message, shard_of
from relay_topics.rules import Levels

log = structlog.get_logger(__name__)

GEN_META = b"\x00meta"
GEN_STATS = b"\x00stats"
SHARD_RECORD = b"relay-shard"
SHARD_MARKS = b"relay-marks"
_GEN_CF = re.compile(r"^gen-(\d+)$")

_SYNC = WriteOptions()
_SYNC.sync = True


def cf_name(number: int) -> str:
    return f"gen-{number}"


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)
    options.set_db_write_buffer_size(64 << 20)  # 64 MiB of memtables per shard, all CFs
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1 << 20)
    return options


@dataclass
class Stats:
    count: int = 0
    min_ts: int | None = None
    max_ts: int | None = None
    """Time span of the messages written (not narrowed by deletes)."""
    seq: int = 0
    """Last sequence number used."""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | None, where: str) -> Stats:
        try:
            data = json.loads(raw or b"")
            stats = cls(**data)
        except (ValueError, TypeError):
            raise CorruptRecord(f"{where}: stats record is damaged") from None
        if not isinstance(stats.count, int) or not isinstance(stats.seq, int):
            raise CorruptRecord(f"{where}: stats record is damaged")
        return stats

    def after(self, messages: Sequence[Message]) -> Stats:
        stamps = [m.ts for m in messages]
        low, high = min(stamps), max(stamps)
        return Stats(
            self.count + len(messages),
            low if self.min_ts is None else min(self.min_ts, low),
            high if self.max_ts is None else max(self.max_ts, high),
            self.seq + len(messages),
        )


class Generation:
    def __init__(
        self,
        spec: catalog.GenerationSpec,
        cf: Rdict,
        handle: ColumnFamily,
        layout: base.Layout,
        stats: Stats,
        where: str,
    ) -> None:
        self.spec = spec
        self.cf = cf
        self.handle = handle
        self.layout = layout
        self.stats = stats
        self.where = where


class Shard:
    def __init__(
        self,
        path: Path,
        db: str,
        shard: ShardId,
        record: catalog.DbRecord,
        read_only: bool = False,
    ) -> None:
        """`read_only`: as it stands now, for reading only (`relay_streams.reading`): nothing
        is created, finished or dropped; what a writer would repair is refused."""
        self.path = path
        self.read_only = read_only
        self.db_name = db
        self.id = shard
        self.where = f"database {db!r} shard {shard}"
        self.generations: dict[GenerationId, Generation] = {}
        # Name every column family the MANIFEST knows: left to itself, rocksdict takes the list
        # from the OPTIONS file, which a crash right after `create_column_family` leaves stale
        # ("Column families not opened"; found by the SIGKILL test).
        existing = Rdict.list_cf(str(path), Options(raw_mode=True)) if path.exists() else []
        self._cfs = set(existing) - {"default"}
        families = {name: Options(raw_mode=True) for name in self._cfs}
        if read_only:
            self.db = reading.retried(
                lambda: Rdict(
                    str(path),
                    reading.options(_options()),
                    column_families=families,
                    access_type=reading.access(),
                ),
                self.where,
            )
        else:
            self.db = Rdict(str(path), _options(), column_families=families)
        self.marks = marks.NEW
        try:
            self._check_identity()
            self.marks = Marks.from_bytes(self.db.get(SHARD_MARKS), self.where)
            self.reconcile(record)
        except BaseException:
            self.close()
            raise

    def _check_identity(self) -> None:
        want = {"db": self.db_name, "shard": self.id}
        raw = self.db.get(SHARD_RECORD)
        if raw is None and self.read_only:
            raise CorruptRecord(f"{self.where}: no shard record")
        if raw is None:  # a new shard: its marks start complete
            batch = WriteBatch(raw_mode=True)
            batch.put(SHARD_RECORD, json.dumps(want).encode())
            batch.put(SHARD_MARKS, marks.NEW.to_bytes())
            self.db.write(batch, _SYNC)
            return
        try:
            found = json.loads(raw)
        except ValueError:
            raise CorruptRecord(f"{self.where}: shard record is damaged") from None
        if found != want:
            raise CorruptRecord(f"{self.path} holds {found}, expected {want}")

    # -- schema ----------------------------------------------------------------------------

    def reconcile(self, record: catalog.DbRecord) -> None:
        """Open every generation of `record`, finishing creations and drops a crash cut short."""
        wanted = {cf_name(spec.number) for spec in record.generations}
        for name in sorted(self._cfs - wanted):
            if self.read_only:
                continue  # a drop a crash cut short: the writer finishes it
            if _GEN_CF.match(name):
                log.warning("streams_generation_dropped_on_open", shard=self.where, cf=name)
                self.db.drop_column_family(name)
                self._cfs.discard(name)
            else:
                log.warning("streams_unknown_column_family", shard=self.where, cf=name)
        previous = None
        for spec in record.generations:
            generation = self.generations.get(spec.number)
            if generation is None:
                generation = self._open_generation(spec, previous)
            generation.spec = spec
            previous = generation

    def _open_generation(
        self, spec: catalog.GenerationSpec, previous: Generation | None
    ) -> Generation:
        where = f"{self.where} generation {spec.number}"
        module = layout_module(spec.layout, where)
        name = cf_name(spec.number)
        if name in self._cfs:
            cf = self.db.get_column_family(name)
        elif self.read_only:
            raise CorruptRecord(f"{where}: no column family {name}")
        else:
            cf = self.db.create_column_family(name, Options(raw_mode=True))
            self._cfs.add(name)
        handle = self.db.get_column_family_handle(name)
        meta = {"generation": spec.number, "layout": spec.layout, "options": spec.options}
        raw = cf.get(GEN_META)
        if raw is None and self.read_only:
            raise CorruptRecord(f"{where}: no meta record")
        if raw is None:
            batch = WriteBatch(raw_mode=True)
            inherited = previous.layout if previous is not None else None
            for key, value in module.create(spec.options, inherited):
                batch.put(key, value, handle)
            batch.put(GEN_STATS, Stats().to_bytes(), handle)
            batch.put(GEN_META, json.dumps(meta).encode(), handle)
            self.db.write(batch, _SYNC)
        else:
            try:
                found = json.loads(raw)
            except ValueError:
                raise CorruptRecord(f"{where}: meta record is damaged") from None
            if found != meta:
                layout_module(str(found.get("layout")) if isinstance(found, dict) else "?", where)
                raise CorruptRecord(f"{where}: meta record {found} does not match db.json {meta}")
        stats = Stats.from_bytes(cf.get(GEN_STATS), where)
        layout = module.open(cf, handle, spec.options, where)
        generation = Generation(spec, cf, handle, layout, stats, where)
        self.generations[spec.number] = generation
        return generation

    def add_generation(self, spec: catalog.GenerationSpec, previous: GenerationId) -> None:
        self._open_generation(spec, self.generations[previous])
        self.generations[previous].layout.closed()

    def drop_generation(self, number: GenerationId) -> None:
        generation = self.generations.pop(number, None)
        del generation  # the column family handles must go before the family is dropped
        name = cf_name(number)
        if name in self._cfs:
            self.db.drop_column_family(name)
            self._cfs.discard(name)

    # -- writes ----------------------------------------------------------------------------

    def prepare(
        self,
        generation: Generation,
        items: Sequence[tuple[Levels, Message]],
        positions: Sequence[Mark | None] = (None,),
    ) -> tuple[WriteBatch, Stats, Marks]:
        """The write batch for messages, and the generation's stats and the shard's marks once
        it is written (`positions`: where the messages came from, None for unknown). The
        layout's in-memory structure already includes the messages (undo: `layout.reload`)."""
        stats = generation.stats
        seq = stats.seq
        batch = WriteBatch(raw_mode=True)
        generation.layout.prepare(
            batch, [(levels, message, seq + i) for i, (levels, message) in enumerate(items, 1)]
        )
        new = stats.after([message for _, message in items])
        batch.put(GEN_STATS, new.to_bytes(), generation.handle)
        new_marks = self.marks.after(positions)
        if new_marks != self.marks:
            batch.put(SHARD_MARKS, new_marks.to_bytes())
        return batch, new, new_marks

    def write(self, batch: WriteBatch) -> None:
        try:
            self.db.write(batch, _SYNC)
        except Exception as e:
            raise WriteFailed(f"{self.where}: {e}") from e

    def put_stats(self, batch: WriteBatch, generation: Generation, stats: Stats) -> None:
        batch.put(GEN_STATS, stats.to_bytes(), generation.handle)

    # -- upkeep ----------------------------------------------------------------------------

    def check(self, shards: int) -> list[str]:
        problems = []
        for _, generation in sorted(self.generations.items()):
            census = generation.layout.check(lambda topic: shard_of(topic, shards) == self.id)
            problems += census.problems
            stats = generation.stats
            where = generation.where
            if census.count != stats.count:
                problems.append(f"{where}: {census.count} messages, stats say {stats.count}")
            if census.max_seq > stats.seq:
                problems.append(f"{where}: sequence {census.max_seq} above stats {stats.seq}")
            if census.count and (
                stats.min_ts is None
                or stats.max_ts is None
                or census.min_ts is None
                or census.max_ts is None
                or census.min_ts < stats.min_ts
                or census.max_ts > stats.max_ts
            ):
                problems.append(f"{where}: messages outside the stats' time span")
        return problems

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def flush_memtables(self) -> None:
        self.db.flush(wait=True)
        for generation in self.generations.values():
            generation.cf.flush(wait=True)

    def families(self) -> list[Rdict]:
        """The shard's column families (the database itself for `default`)."""
        return [self.db, *(g.cf for g in self.generations.values())]

    def checkpoint(self, target: Path) -> None:
        """A RocksDB checkpoint of this shard at `target` (hard links, same filesystem; brief
        after `checkpoints.flush_early` of its `families`)."""
        checkpoints.create(self.db, target)

    def close(self) -> None:
        self.generations.clear()
        self.db.close()

    def describe(self) -> dict[str, Any]:
        return {
            str(number): {"streams": g.layout.stream_count(), "messages": g.stats.count}
            for number, g in sorted(self.generations.items())
        }
