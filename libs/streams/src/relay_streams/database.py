"""A database: shards of generations of streams, with egress batching (seed 003).

Writes: `store_batch` validates every message first (a bad one refuses the whole call, nothing
is stored), routes each to its topic's shard, and hands them to the egress buffer, which writes
them into the current generation of each shard.

Reads: `get_streams(filter, start)` lists streams ranked (X, Y) = (shard, generation);
`make_iterator` and `next` replay one stream from `start` in (ts, seq) order. A closed
generation takes no more writes, so an iterator that reaches its end is at `end_of_stream`; an
iterator of a dropped generation ends at once, without error.

Invariants:
- `db.json` (`catalog`) lists the generations; shards follow it (see `shard.Shard.reconcile`);
- a schema change (new or dropped generation) and deletes run with writes held off
  (`Egress.exclusive`), after the buffer has been written into the generation it was meant for;
- structural state (schema, tries, stats) changes only under `_lock`; RocksDB reads run
  outside it.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rocksdict import WriteBatch

from relay_ds import errors as ds_errors
from relay_ds import info as ds_info
from relay_ds.sites import SiteId
from relay_ds.tokens import (
    MAX_TS,
    GenerationId,
    Position,
    ShardId,
    StaticIndex,
    Stream,
    StreamIterator,
)
from relay_streams import catalog, checkpoints, sites
from relay_streams.egress import Egress
from relay_streams.errors import BadInput, BadToken, Closed, CorruptRecord, NotFound
from relay_streams.layouts import layout_module
from relay_streams.marks import Mark, Marks
from relay_streams.model import Message, NextResult, RankedStream, shard_of
from relay_streams.settings import DbSettings
from relay_streams.shard import Shard
from relay_topics import rules
from relay_topics.rules import Levels

MAX_BATCH_READ = 100_000  # messages one `next` may return
_DELETE_CHUNK = 1_000  # messages per delete write batch

_Item = tuple[int, Levels, Message, Mark | None]
"""Shard, topic levels, message, and where in the log it came from (None: unknown)."""


@dataclass(frozen=True)
class GenerationInfo:
    number: GenerationId
    layout: str
    since: int
    """Unix ms when it began taking writes."""
    until: int | None
    """Unix ms when it was closed; None for the current generation."""
    messages: int
    min_ts: int | None
    max_ts: int | None
    """Time span of the messages written into it (all shards)."""
    streams: int


def _check_ts(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TS:
        raise BadInput(f"{what} must be Unix ms in 0..{MAX_TS}, got {value!r}")
    return value


@contextmanager
def _token_refusal() -> Iterator[None]:
    """A string that `relay_ds.tokens` refuses is this store's `BadToken` (400 like any bad
    input), so callers catch one hierarchy."""
    try:
        yield
    except ds_errors.BadToken as e:
        raise BadToken(str(e)) from None


def _parse_filter(topic_filter: object) -> Levels:
    try:
        return rules.parse_filter(topic_filter)
    except rules.TopicError as e:
        raise BadInput(str(e)) from None


class Database:
    def __init__(
        self,
        path: Path,
        name: str,
        settings: DbSettings | None,
        this_site: SiteId,
        clock: Callable[[], int],
        read_only: bool = False,
    ) -> None:
        """`read_only`: an existing database as it stands now, for reading only (its shards
        opened read-only, `relay_streams.reading`; `settings` must be None)."""
        self.path = path
        self.name = catalog.parse_name(name)
        self.clock = clock
        self._record_path = path / "db.json"
        changed = False
        if self._record_path.exists():
            record = catalog.DbRecord.load(self._record_path)
            if record.name != name:
                raise CorruptRecord(f"{self._record_path} names database {record.name!r}")
            if settings is not None and settings != record.settings:
                if settings.shards != record.settings.shards:
                    raise BadInput(
                        f"database {name!r} has {record.settings.shards} shards; the shard "
                        f"count is fixed when a database is created"
                    )
                record.settings = settings
                changed = True  # saved once the database opened
        elif read_only:
            raise NotFound(f"database {name!r} does not exist at {path}")
        else:
            settings = settings or DbSettings()
            now = clock()
            first = catalog.GenerationSpec(
                GenerationId(1), settings.layout, settings.layout_options(), now, None
            )
            replicas = sites.ReplicaSet([this_site], [this_site])
            record = catalog.DbRecord(name, now, settings, [first], replicas)
            path.mkdir(parents=True, exist_ok=True)
            record.save(self._record_path)
        for spec in record.generations:
            layout_module(spec.layout, f"database {name!r} generation {spec.number}")
        self.record = record
        self.this_site = this_site
        self._lock = threading.RLock()
        self._closed = False
        self.shards: list[Shard] = []
        try:
            for i in range(record.settings.shards):
                shard = Shard(path / f"shard-{i}", name, ShardId(i), record, read_only)
                self.shards.append(shard)
            if changed:
                record.save(self._record_path)
        except BaseException:
            for shard in self.shards:
                shard.close()
            raise
        self._stamp_lock = threading.Lock()
        self._last_stamp = 0
        """The last ts the store assigned (only assigned ones: a client's far-future ts must
        not hold the clock up)."""
        self.egress: Egress[_Item] = Egress(
            self._write,
            record.settings.egress_batch_size,
            record.settings.egress_flush_interval_ms / 1000,
            name,
        )

    @property
    def settings(self) -> DbSettings:
        return self.record.settings

    def _alive(self) -> None:
        if self._closed:
            raise Closed(f"database {self.name!r} is closed")

    # -- writes ----------------------------------------------------------------------------

    def store_batch(
        self,
        messages: Iterable[Message | tuple[str, bytes]],
        sync: bool = True,
        positions: Sequence[Mark | None] | None = None,
    ) -> list[Message]:
        """Store messages: `Message`s keep their ts; `(topic, payload)` pairs get a ts from the
        store's clock, never decreasing in this database, so that live iterators see them all
        (an iterator past time T never sees a message stored later with a ts before T). The
        messages as stored (each with its ts), in order.

        With `sync` (the default), return once they are durable (WAL fsynced); else return at
        once and let the egress buffer write them (module `egress`). Any invalid message
        refuses the whole call with `BadInput`; nothing is stored.

        `positions` (aligned with `messages`): where each came from in the log, kept with it in
        its shard's write batch (`Shard.marks`); None is an unknown position, which makes the
        touched shards' marks incomplete (`relay_streams.marks`)."""
        self._alive()
        shards = len(self.shards)
        messages = list(messages)
        if positions is not None and len(positions) != len(messages):
            raise BadInput(f"{len(positions)} positions for {len(messages)} messages")
        marked = positions if positions is not None else [None] * len(messages)
        checked: list[tuple[str, Levels, bytes, int | None]] = []
        for i, message in enumerate(messages):
            if isinstance(message, Message):
                topic, payload, ts = message
                _check_ts(ts, f"message {i}: ts")
            elif isinstance(message, tuple) and len(message) == 2:
                (topic, payload), ts = message, None
            else:
                raise BadInput(f"message {i}: not a Message or a (topic, payload) pair")
            try:
                levels = rules.parse_topic(topic)
            except rules.TopicError as e:
                raise BadInput(f"message {i}: {e}") from None
            if not isinstance(payload, bytes):
                raise BadInput(f"message {i}: payload must be bytes")
            checked.append((topic, levels, payload, ts))
        with self._stamp_lock:  # stamps and buffer order agree
            now = max(self.clock(), self._last_stamp)
            self._last_stamp = now
            items: list[_Item] = [
                (
                    shard_of(topic, shards),
                    levels,
                    Message(topic, payload, ts if ts is not None else now),
                    mark,
                )
                for (topic, levels, payload, ts), mark in zip(checked, marked, strict=True)
            ]
            last = self.egress.enqueue(items, sync)
        if sync and items:
            self.egress.wait(last - len(items) + 1, last)
        return [message for _, _, message, _ in items]

    def flush(self) -> None:
        """Write whatever the egress buffer holds, and return once it is durable."""
        self._alive()
        self.egress.flush()

    def _write(self, items: list[_Item]) -> None:
        """Egress callback (runs with writes serialised): one write batch per shard."""
        groups: dict[int, list[tuple[Levels, Message]]] = {}
        positions: dict[int, list[Mark | None]] = {}
        for shard_id, levels, message, mark in items:
            groups.setdefault(shard_id, []).append((levels, message))
            positions.setdefault(shard_id, []).append(mark)
        for shard_id, group in sorted(groups.items()):
            shard = self.shards[shard_id]
            with self._lock:
                generation = shard.generations[self.record.current.number]
                batch, stats, marks = shard.prepare(generation, group, positions[shard_id])
            try:
                shard.write(batch)
            except BaseException:
                with self._lock:
                    generation.layout.reload()
                raise
            generation.stats = stats
            shard.marks = marks

    def delete(
        self,
        topic_filter: str | None,
        predicate: Callable[[Message], bool] | None = None,
        start: int = 0,
    ) -> int:
        """Delete the messages matching the filter (ts >= start) for which `predicate` is
        true (all, if None), in every generation; returns how many. A `topic_filter` of None
        is every topic, `$` topics included (as `every_message`: a partition's hand-off, not
        a subscriber). Buffered messages are written first, so they are considered too.
        Deletes are durable in chunks of `_DELETE_CHUNK`: if `predicate` raises, earlier
        chunks stay deleted."""
        self._alive()
        flt = None if topic_filter is None else _parse_filter(topic_filter)
        _check_ts(start, "start")
        deleted = 0
        with self.egress.exclusive():
            for shard in self.shards:
                with self._lock:
                    generations = list(shard.generations.values())
                for generation in generations:
                    layout = generation.layout
                    with self._lock:
                        statics = layout.every_stream() if flt is None else layout.streams(flt)
                    for static in statics:
                        after = None
                        while True:
                            found = layout.read(static, flt, start, after, _DELETE_CHUNK)
                            doomed = [
                                position
                                for position, message in found.found
                                if predicate is None or predicate(message)
                            ]
                            if doomed:
                                batch = WriteBatch(raw_mode=True)
                                for position in doomed:
                                    batch.delete(layout.key(static, position), generation.handle)
                                stats = dataclasses.replace(
                                    generation.stats, count=generation.stats.count - len(doomed)
                                )
                                shard.put_stats(batch, generation, stats)
                                shard.write(batch)
                                generation.stats = stats
                                deleted += len(doomed)
                            if found.exhausted or found.scanned is None:
                                break
                            after = found.scanned
        return deleted

    # -- reads -----------------------------------------------------------------------------

    def get_streams(self, topic_filter: str, start: int = 0) -> list[RankedStream]:
        """Streams that may hold messages matching the filter with ts >= start, ranked
        (shard, generation), sorted by rank. Refresh the list from time to time: new streams
        appear as topics are learned and generations are added."""
        self._alive()
        flt = _parse_filter(topic_filter)
        _check_ts(start, "start")
        found = []
        with self._lock:
            for shard in self.shards:
                for spec in self.record.generations:
                    generation = shard.generations[spec.number]
                    if spec.until is not None:
                        newest = generation.stats.max_ts
                        if newest is None or newest < start:
                            continue  # closed, and nothing in it is recent enough
                    rank = (int(shard.id), int(spec.number))
                    for static in generation.layout.streams(flt):
                        stream = Stream(self.name, shard.id, spec.number, static)
                        found.append(RankedStream(rank, stream))
        return found

    def _stream(self, stream: Stream | str) -> Stream:
        if isinstance(stream, str):
            with _token_refusal():
                stream = Stream.from_token(stream)
        if stream.db != self.name:
            raise BadToken(f"stream of database {stream.db!r}, not {self.name!r}")
        if stream.shard >= len(self.shards):
            raise BadToken(f"database {self.name!r} has no shard {stream.shard}")
        return stream

    def make_iterator(
        self, stream: Stream | str, topic_filter: str, start: int = 0
    ) -> StreamIterator:
        """An iterator over the stream's messages that match the filter, from `start` (ms)."""
        self._alive()
        stream = self._stream(stream)
        _parse_filter(topic_filter)
        _check_ts(start, "start")
        with self._lock:
            generation = self.shards[stream.shard].generations.get(stream.generation)
            if generation is None:
                raise NotFound(
                    f"database {self.name!r} has no generation {stream.generation} (dropped?)"
                )
            if not generation.layout.has_stream(stream.static):
                raise BadToken(f"{generation.where} has no stream {stream.static}")
        return StreamIterator(stream, topic_filter, start, None)

    def next(
        self, iterator: StreamIterator | str, n: int, max_bytes: int | None = None
    ) -> NextResult:
        """Up to `n` messages after the iterator's position, the iterator to continue from,
        and whether the stream has ended (see `NextResult`). With `max_bytes`, stop after the
        message that brings the topics and payloads returned to `max_bytes` or more (at least
        one message is returned), so an answer fits a bounded transport; the iterator then
        continues right after the last message returned."""
        self._alive()
        if isinstance(iterator, str):
            with _token_refusal():
                iterator = StreamIterator.from_token(iterator)
        stream = self._stream(iterator.stream)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_BATCH_READ:
            raise BadInput(f"n must be in 1..{MAX_BATCH_READ}, got {n!r}")
        try:
            flt = rules.parse_filter(iterator.topic_filter)
        except rules.TopicError as e:
            raise BadToken(f"iterator filter: {e}") from None
        with self._lock:
            spec = self.record.generation(stream.generation)
            if spec is None:
                if stream.generation < self.record.current.number:
                    return NextResult([], iterator, True)  # dropped: the stream has ended
                raise BadToken(f"database {self.name!r} has no generation {stream.generation}")
            closed = spec.until is not None  # read before the data: no writes after closing
            layout = self.shards[stream.shard].generations[stream.generation].layout
        if max_bytes is not None and (
            not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1
        ):
            raise BadInput(f"max_bytes must be a positive integer, got {max_bytes!r}")
        result = layout.read(StaticIndex(stream.static), flt, iterator.start, iterator.after, n)
        found, scanned, exhausted = result.found, result.scanned, result.exhausted
        if max_bytes is not None:
            size = 0
            for i, (position, message) in enumerate(found):
                size += len(message.topic.encode()) + len(message.payload)
                if size >= max_bytes and i + 1 < len(found):
                    found, scanned, exhausted = found[: i + 1], position, False
                    break
        if scanned is not None:
            iterator = dataclasses.replace(iterator, after=scanned)
        return NextResult([message for _, message in found], iterator, closed and exhausted)

    def every_message(self, page: int = MAX_BATCH_READ) -> Iterator[list[Message]]:
        """Every message of every stream of every shard and generation, in pages of up to
        `page`, with no topic filter: unlike a subscription's `#`, this includes topics whose
        first level starts with `$` (the MQTT rule is for subscribers, not for exports and
        restores). Messages written meanwhile may or may not be included."""
        self._alive()
        for shard in self.shards:
            with self._lock:
                layouts = [
                    shard.generations[spec.number].layout for spec in self.record.generations
                ]
            for layout in layouts:
                for static in layout.every_stream():
                    after: Position | None = None
                    while True:
                        result = layout.read(static, None, 0, after, page)
                        if result.found:
                            yield [message for _, message in result.found]
                        if result.exhausted or result.scanned is None:
                            break
                        after = result.scanned

    def topic_tail(self, topic: str, start: int) -> list[Message]:
        """The messages of `topic` itself (no wildcard; `$` topics too) with ts >= `start`, in
        stream order (older generation first). Cost: a read of the topic's streams from
        `start` on, messages of other topics that share them included."""
        self._alive()
        try:
            levels = rules.parse_topic(topic)
        except rules.TopicError as e:
            raise BadInput(str(e)) from None
        _check_ts(start, "start")
        out: list[Message] = []
        shard = self.shards[shard_of(topic, len(self.shards))]
        with self._lock:
            layouts = [shard.generations[spec.number].layout for spec in self.record.generations]
        for layout in layouts:
            with self._lock:
                statics = layout.streams(levels)
            for static in statics:
                after: Position | None = None
                while True:
                    found = layout.read(static, levels, start, after, MAX_BATCH_READ)
                    out += [m for _, m in found.found if m.topic == topic]
                    if found.exhausted or found.scanned is None:
                        break
                    after = found.scanned
        return out

    def marks(self) -> list[Marks]:
        """Each shard's marks, by shard number (`relay_streams.marks`)."""
        return [shard.marks for shard in self.shards]

    def checkpoint(self, target: Path) -> None:
        """`db.json` and a RocksDB checkpoint of each shard under `target`
        (`StreamStore.checkpoint`). The memtables are flushed first in RocksDB's background
        (`relay_streams.checkpoints`), without the lock that writes take to prepare a batch;
        the lock is held only for the brief checkpoints, so that `db.json` and the shards'
        generations agree in the copy."""
        self._alive()
        target.mkdir(parents=True)
        with self._lock:
            families = [family for shard in self.shards for family in shard.families()]
        checkpoints.flush_early(families)
        with self._lock:
            shutil.copyfile(self._record_path, target / "db.json")
            for shard in self.shards:
                shard.checkpoint(target / f"shard-{int(shard.id)}")

    # -- generations -----------------------------------------------------------------------

    def add_generation(self, since: int | None = None) -> GenerationInfo:
        """Close the current generation and open a new one (layout and thresholds from the
        current settings; learned topic structure inherited). Buffered messages are written
        into the old generation first. `since` (ms) defaults to now."""
        self._alive()
        with self.egress.exclusive(), self._lock:
            now = self.clock() if since is None else _check_ts(since, "since")
            current = self.record.current
            if now < current.since:
                raise BadInput(f"since {now} is before the current generation's {current.since}")
            spec = catalog.GenerationSpec(
                GenerationId(current.number + 1),
                self.settings.layout,
                self.settings.layout_options(),
                now,
                None,
            )
            current.until = now
            self.record.generations.append(spec)
            try:
                self.record.save(self._record_path)
            except BaseException:
                current.until = None
                self.record.generations.pop()
                raise
            for shard in self.shards:
                shard.add_generation(spec, current.number)
        return self._info(spec)

    def drop_generation(self, number: int) -> None:
        """Drop a closed generation: its data goes, its iterators end. The current one cannot
        be dropped (add a generation first)."""
        self._alive()
        with self.egress.exclusive(), self._lock:
            spec = self.record.generation(number)
            if spec is None:
                raise NotFound(f"database {self.name!r} has no generation {number}")
            if spec is self.record.current:
                raise BadInput(f"generation {number} is the current one; add a generation first")
            self.record.generations.remove(spec)
            self.record.save(self._record_path)
            for shard in self.shards:
                shard.drop_generation(spec.number)

    def drop_generations_before(self, cutoff: int) -> list[GenerationId]:
        """Retention: drop every closed generation closed at or before `cutoff` (ms)."""
        _check_ts(cutoff, "cutoff")
        with self._lock:
            doomed = [
                g.number
                for g in self.record.generations
                if g.until is not None and g.until <= cutoff
            ]
        for number in doomed:
            self.drop_generation(number)
        return doomed

    def _info(self, spec: catalog.GenerationSpec) -> GenerationInfo:
        gens = [shard.generations[spec.number] for shard in self.shards]
        lows = [g.stats.min_ts for g in gens if g.stats.min_ts is not None]
        highs = [g.stats.max_ts for g in gens if g.stats.max_ts is not None]
        return GenerationInfo(
            spec.number,
            spec.layout,
            spec.since,
            spec.until,
            sum(g.stats.count for g in gens),
            min(lows) if lows else None,
            max(highs) if highs else None,
            sum(g.layout.stream_count() for g in gens),
        )

    def generations(self) -> list[GenerationInfo]:
        self._alive()
        with self._lock:
            return [self._info(spec) for spec in self.record.generations]

    # -- replicas --------------------------------------------------------------------------

    def set_replicas(self, target: Sequence[SiteId]) -> None:
        """Record a validated replica set target (`sites.validate_target`)."""
        with self._lock:
            self.record.replicas.target = list(target)
            self.record.save(self._record_path)

    def shard_infos(self) -> list[ds_info.Shard]:
        with self._lock:
            return sites.shard_infos(self.record.replicas, len(self.shards), self.this_site)

    # -- upkeep ----------------------------------------------------------------------------

    def check(self) -> list[str]:
        """Read everything and report what is inconsistent (empty list: all good): db.json
        against memory, each shard's generations against db.json, every record, the stats."""
        self._alive()
        problems: list[str] = []
        with self.egress.exclusive(), self._lock:
            try:
                on_disk = catalog.DbRecord.load(self._record_path)
                if on_disk != self.record:
                    problems.append(f"{self._record_path} differs from the open database")
            except CorruptRecord as e:
                problems.append(str(e))
            wanted = {spec.number for spec in self.record.generations}
            for shard in self.shards:
                if set(shard.generations) != wanted:
                    problems.append(
                        f"{shard.where}: generations {sorted(shard.generations)}, "
                        f"db.json lists {sorted(wanted)}"
                    )
                problems += shard.check(len(self.shards))
        return problems

    def disk_bytes(self, flush: bool = False) -> int:
        """Bytes of every file of the database; `flush` first writes memtables to SST files."""
        with self.egress.exclusive():
            if flush:
                for shard in self.shards:
                    shard.flush_memtables()
            return sum(shard.disk_bytes() for shard in self.shards)

    def close(self) -> None:
        """Write the egress buffer, stop the flusher and close the shards. Idempotent."""
        if self._closed:
            return
        self.egress.close()
        with self._lock:
            self._closed = True
            for shard in self.shards:
                shard.close()
