"""The retained-message store (issue 8, seed 002): the last retained message of each topic, on
one RocksDB instance, topic-compacted (docs/decisions/0007-retained-store.md).

Keys (version 1, raw bytes):
- `\\x00meta`  -> `{"v": 1, "layout": "retained/1"}`, written when the folder is created;
- `\\x00count` -> retained topics as u64 big-endian (the O(1) `size`);
- `\\x00marks` -> the log positions the writes came from (`relay_streams.marks`), written in
  the batch of every write; created with the store (absent in a store made before marks);
- `\\x01 | topic levels joined by \\x00` -> `\\x01 | ts u64 | expires_at u64 (0: never) | qos u8
  | payload` (one record per topic: a store replaces it, so nothing needs folding);
- `\\x02 | expires_at u64 | topic key` -> `` (the expiry index, read by `clear_expired`).
A topic's levels are joined with NUL (which topics may not contain), so keys sort level by level
(`a/b` < `a/b/c` < `a!`: every topic under `a/b` is one contiguous range) and a filter's literal
prefix is a range; `+` levels are skipped over with seeks instead of scanned.

Invariants:
- every write is one RocksDB write batch with `sync=True` (WAL fdatasync'ed before it returns):
  the message, its expiry index entry, the removal of the replaced one and the new count are in
  the same batch, so after any crash the count and the expiry index match the messages, and
  the marks say exactly which records' writes a copy holds;
- writes are serialised by a lock (each is a read-modify-write of the count); reads take no lock
  and see each write whole or not at all;
- refused input (`BadInput`, `TopicError`, `RetainedFull`) changes nothing;
- an expired message is never returned, even before `clear_expired` removes it; until then it is
  still counted by `size` and still takes its place in `max_retained`.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from relay_streams import checkpoints, marks, reading
from relay_streams.errors import BadInput, Closed, CorruptRecord, StreamsError, WriteFailed
from relay_streams.marks import Mark, Marks
from relay_topics import pages, rules
from relay_topics.rules import Levels

META = b"\x00meta"
COUNT = b"\x00count"
MARKS = b"\x00marks"
MESSAGES = b"\x01"
EXPIRY = b"\x02"
LAYOUT = "retained/1"
VALUE_FORMAT = 1
SEP = pages.SEP  # between levels in keys (topics hold no NUL)
_U64 = struct.Struct(">Q")
_HEAD = struct.Struct(">BQQB")  # format, ts, expires_at, qos

_SYNC = WriteOptions()
_SYNC.sync = True


class RetainedFull(StreamsError):
    """`max_retained` topics are retained: a new topic is refused (existing ones still update);
    nothing was changed."""


@dataclass(frozen=True)
class RetainedSettings:
    max_payload_bytes: int = 1 << 20  # 1 MiB
    """Largest payload `store` accepts; a larger one is `BadInput`."""
    max_retained: int = 0  # topics; 0 = no limit
    """Most topics retained at once; at the limit a new topic is refused with `RetainedFull`."""

    def __post_init__(self) -> None:
        for name in ("max_payload_bytes", "max_retained"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadInput(f"{name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class Write:
    """One write of `store_many`: an empty payload deletes the topic's message."""

    topic: str
    payload: bytes
    qos: int = 0
    expiry_interval_s: int | None = None
    """Seconds until the message expires (MQTT 5 Message Expiry Interval); None: never."""
    ts: int | None = None
    """The message's Unix ms (expiry counts from it); None: the call's `now`."""
    expires_at: int | None = None
    """Unix ms at which it expires, in place of `expiry_interval_s` (a copy of a stored
    message: `Retained.expires_at` as it stands); None: from `expiry_interval_s`."""


@dataclass(frozen=True)
class Retained:
    """One retained message. `ts` and `expires_at` are Unix milliseconds; `expires_at` None
    means it never expires."""

    topic: str
    payload: bytes
    qos: int = 0
    ts: int = 0
    expires_at: int | None = None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def topic_key(levels: Levels) -> bytes:
    """A message's key: its levels in the order of retained pages (`pages.levels_key`), so
    scans come in that order and several stores' answers merge by `pages.order_key`."""
    return MESSAGES + pages.levels_key(levels)


def _decode_value(topic: str, raw: bytes) -> Retained:
    try:
        fmt, ts, expires_at, qos = _HEAD.unpack_from(raw)
    except struct.error:
        raise CorruptRecord(f"retained record of {topic!r} is damaged") from None
    if fmt != VALUE_FORMAT:
        raise CorruptRecord(f"retained record of {topic!r} has unknown format {fmt}")
    return Retained(topic, bytes(raw[_HEAD.size :]), qos, ts, expires_at or None)


def _encode_value(message: Retained) -> bytes:
    head = _HEAD.pack(VALUE_FORMAT, message.ts, message.expires_at or 0, message.qos)
    return head + message.payload


def _topic_of(key: bytes) -> str:
    return key[1:].replace(SEP, b"/").decode()


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1 << 20)
    return options


class RetainedStore:
    """The retained messages under `path` (a RocksDB folder, created if missing)."""

    def __init__(
        self, path: Path, settings: RetainedSettings | None = None, *, read_only: bool = False
    ) -> None:
        """`read_only`: open a store another process (or this one) keeps writing, as it stands
        now, for reading only (`relay_streams.reading`); writes then fail."""
        self.path = Path(path)
        self.settings = settings or RetainedSettings()
        self._lock = threading.Lock()
        self._closed = False
        if read_only:
            self.db = reading.retried(
                lambda: Rdict(
                    str(self.path), reading.options(_options()), access_type=reading.access()
                ),
                str(self.path),
            )
        else:
            self.db = Rdict(str(self.path), _options())
        try:
            meta = self.db.get(META)
            if meta is None and read_only:
                raise CorruptRecord(f"{self.path}: not a retained store (no meta record)")
            if meta is None:
                batch = WriteBatch(raw_mode=True)
                batch.put(META, json.dumps({"v": 1, "layout": LAYOUT}).encode())
                batch.put(COUNT, _U64.pack(0))
                batch.put(MARKS, marks.NEW.to_bytes())
                self.db.write(batch, _SYNC)
            else:
                found = json.loads(meta)
                if found.get("layout") != LAYOUT:
                    raise CorruptRecord(f"{self.path}: unknown retained layout {found!r}")
            self._count = self._read_count()
            self._marks = Marks.from_bytes(self.db.get(MARKS), str(self.path))
        except BaseException:
            self.db.close()
            raise

    def checkpoint(self, target: Path) -> None:
        """A point-in-time copy of the store at `target` (a new folder on the same filesystem:
        RocksDB's checkpoint, hard links to its files), openable as a `RetainedStore`; writes
        going on meanwhile are either wholly in it or not at all (one write batch each), and
        its `marks` say which (`relay_streams.checkpoints`: the GIL is held only briefly)."""
        self._check_open()
        checkpoints.take(self.db, [self.db], target)

    @property
    def marks(self) -> Marks:
        """The log positions of the writes this store holds (`relay_streams.marks`)."""
        return self._marks

    def close(self) -> None:
        """Close the RocksDB instance (idempotent); later calls raise `Closed`."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.db.close()

    def __enter__(self) -> RetainedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> list[str]:
        """Integrity problems (empty when sound): the count matches the message records, each
        message decodes, and the expiry index holds exactly the messages' expiries. Reads
        everything, O(n); for tests and post-mortems."""
        self._check_open()
        problems: list[str] = []
        with self._lock:
            messages = 0
            expiries: set[bytes] = set()
            options = ReadOptions()
            options.set_iterate_upper_bound(EXPIRY)
            for key, value in self.db.items(from_key=MESSAGES, read_opt=options):
                assert isinstance(key, bytes)  # raw mode
                assert isinstance(value, bytes)
                messages += 1
                try:
                    message = _decode_value(_topic_of(key), value)
                except (CorruptRecord, UnicodeDecodeError) as e:
                    problems.append(f"{key!r}: {e}")
                    continue
                if message.expires_at is not None:
                    expiries.add(EXPIRY + _U64.pack(message.expires_at) + key)
            options = ReadOptions()
            options.set_iterate_upper_bound(b"\x03")
            indexed = set()
            for key in self.db.keys(from_key=EXPIRY, read_opt=options):
                assert isinstance(key, bytes)
                indexed.add(key)
            if self._read_count() != messages or self._count != messages:
                problems.append(f"count {self._read_count()} but {messages} messages")
            for key in sorted(indexed - expiries):
                problems.append(f"expiry entry {key!r} without its message")
            for key in sorted(expiries - indexed):
                problems.append(f"message expiry {key!r} not indexed")
        return problems

    def _read_count(self) -> int:
        raw = self.db.get(COUNT)
        if raw is None or len(raw) != 8:
            raise CorruptRecord(f"{self.path}: count record is damaged")
        count: int = _U64.unpack(raw)[0]
        return count

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"retained store {self.path} is closed")

    def _write(self, batch: WriteBatch) -> None:
        try:
            self.db.write(batch, _SYNC)
        except Exception as e:  # rocksdict raises plain exceptions for engine errors
            raise WriteFailed(f"{self.path}: {e}") from e

    # -- writes ----------------------------------------------------------------------------

    def store(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        expiry_interval_s: int | None = None,
        now: int | None = None,
    ) -> bool:
        """Retain `payload` as the topic's message (replacing the previous one); an empty payload
        deletes it (MQTT 3.3.1.3). Returns whether a message is now retained. Durable when it
        returns. Cost: one point read and one synced write batch of at most 4 keys, O(log n).

        Raises `TopicError`/`BadInput` for an invalid topic, qos, expiry or a payload over
        `max_payload_bytes`, and `RetainedFull` for a new topic when `max_retained` are kept.
        """
        return self.store_many([Write(topic, payload, qos, expiry_interval_s)], now=now)[0]

    def store_many(
        self,
        writes: Sequence[Write],
        now: int | None = None,
        positions: Sequence[Mark | None] | None = None,
    ) -> list[bool]:
        """`store` for each write in order (a later write of a topic wins), all in one synced
        write batch: one fsync for the lot (the service's group commit). Whether each write left
        a message retained. All or nothing: any invalid write, or more new topics than
        `max_retained` leaves room for, raises and changes nothing. Cost: one multi-get and one
        synced batch of at most 3 keys per write plus the count and the marks.

        `positions`: where each write came from in the log (aligned with `writes`), kept in the
        same batch (`marks`); None, or a None among them, is a write of unknown position, which
        makes the marks incomplete (`relay_streams.marks`).
        """
        if positions is not None and len(positions) != len(writes):
            raise BadInput(f"{len(positions)} positions for {len(writes)} writes")
        self._check_open()
        checked = [self._checked(write) for write in writes]
        ts = now_ms() if now is None else now
        with self._lock:
            self._check_open()
            keys = list(dict.fromkeys(key for key, _levels, _write in checked))
            wanted: list[Any] = list(keys)  # rocksdict's stub wants list[str | int | ...]
            found = self.db.get(wanted) if keys else []
            assert isinstance(found, list)  # a list of keys gets a list of values
            current: dict[bytes, bytes | None] = dict(zip(keys, found, strict=True))
            batch = WriteBatch(raw_mode=True)
            count = self._count
            results = []
            for key, levels, write in checked:
                old = current[key]
                if old is not None:
                    old_expiry = _decode_value("/".join(levels), old).expires_at
                    if old_expiry is not None:
                        batch.delete(EXPIRY + _U64.pack(old_expiry) + key)
                if not write.payload:  # a delete
                    if old is not None:
                        batch.delete(key)
                        count -= 1
                    current[key] = None
                    results.append(False)
                    continue
                limit = self.settings.max_retained
                if old is None and limit and count >= limit:
                    raise RetainedFull(
                        f"{count} topics retained (max_retained); new topic {write.topic!r} "
                        "refused, no write of the call applied"
                    )
                at = ts if write.ts is None else write.ts
                expires_at = _expires_at(write, at)
                value = _encode_value(
                    Retained(write.topic, write.payload, write.qos, at, expires_at)
                )
                batch.put(key, value)
                if expires_at is not None:
                    batch.put(EXPIRY + _U64.pack(expires_at) + key, b"")
                count += old is None
                current[key] = value
                results.append(True)
            batch.put(COUNT, _U64.pack(count))
            new_marks = self._marks.after(positions if positions is not None else [None])
            if writes and new_marks != self._marks:
                batch.put(MARKS, new_marks.to_bytes())
            self._write(batch)
            self._count = count
            if writes:
                self._marks = new_marks
        return results

    def _checked(self, write: Write) -> tuple[bytes, Levels, Write]:
        """The write's key and levels, with its payload as bytes; `TopicError`/`BadInput`."""
        levels = rules.parse_topic(write.topic)
        payload = write.payload
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise BadInput(f"payload must be bytes, not {type(payload).__name__}")
        payload = bytes(payload)
        if len(payload) > self.settings.max_payload_bytes:
            raise BadInput(
                f"payload is {len(payload)} bytes, over the {self.settings.max_payload_bytes}"
                "-byte limit"
            )
        qos = write.qos
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise BadInput(f"qos must be 0, 1 or 2, got {qos!r}")
        expiry = write.expiry_interval_s
        if expiry is not None and (
            not isinstance(expiry, int) or isinstance(expiry, bool) or not 0 < expiry < 1 << 32
        ):
            raise BadInput(f"expiry_interval_s must be in 1..2**32-1, got {expiry!r}")
        at = write.ts
        if at is not None and (
            not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < 1 << 53
        ):
            raise BadInput(f"ts must be in 0..2**53-1, got {at!r}")
        until = write.expires_at
        if until is not None and (
            not isinstance(until, int) or isinstance(until, bool) or not 0 < until < 1 << 63
        ):
            raise BadInput(f"expires_at must be in 1..2**63-1, got {until!r}")
        return topic_key(levels), levels, Write(write.topic, payload, qos, expiry, at, until)

    def delete(self, topic: str) -> bool:
        """Forget the topic's retained message; whether there was one. Durable when it returns.
        Cost: one point read and, if retained, one synced batch of 3 keys."""
        self._check_open()
        return self._delete(rules.parse_topic(topic))

    def _delete(self, levels: Levels) -> bool:
        key = topic_key(levels)
        with self._lock:
            self._check_open()
            old = self.db.get(key)
            if old is None:
                return False
            self._remove([(key, old)])
            return True

    def _remove(self, records: list[tuple[bytes, bytes]]) -> None:
        """Delete message records (key, value) with their expiry entries, in one batch; the
        caller holds the lock and has read each record under it."""
        batch = WriteBatch(raw_mode=True)
        for key, value in records:
            expires_at = _decode_value(_topic_of(key), value).expires_at
            batch.delete(key)
            if expires_at is not None:
                batch.delete(EXPIRY + _U64.pack(expires_at) + key)
        count = self._count - len(records)
        batch.put(COUNT, _U64.pack(count))
        self._write(batch)
        self._count = count

    def clear_expired(
        self, now: int | None = None, batch_size: int = 1000, topics: list[str] | None = None
    ) -> int:
        """Delete every message whose expiry is due (expires_at <= now); how many (and their
        topics appended to `topics`, when given). Cost: a scan of the expiry index up to `now`
        (only due entries are read, O(due + log n)), written in synced batches of `batch_size`
        (each batch is whole: a crash leaves a consistent store).
        """
        self._check_open()
        cutoff = now_ms() if now is None else now
        upper = EXPIRY + _U64.pack(cutoff + 1)
        removed = 0
        while True:
            with self._lock:
                self._check_open()
                records: list[tuple[bytes, bytes]] = []
                options = ReadOptions()
                options.set_iterate_upper_bound(upper)
                for index_key in self.db.keys(from_key=EXPIRY, read_opt=options):
                    assert isinstance(index_key, bytes)  # raw mode
                    key = index_key[1 + 8 :]
                    value = self.db.get(key)
                    if value is None:
                        raise CorruptRecord(f"{self.path}: expiry entry without message {key!r}")
                    records.append((key, value))
                    if len(records) >= batch_size:
                        break
                if not records:
                    return removed
                self._remove(records)
                removed += len(records)
                if topics is not None:
                    topics.extend(_topic_of(key) for key, _ in records)

    def clean(self) -> None:
        """Delete every retained message. Durable when it returns. Cost: two range deletes
        (tombstones; RocksDB reclaims the space in compaction), O(1) writes."""
        self._check_open()
        with self._lock:
            self._check_open()
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(MESSAGES, EXPIRY)
            batch.delete_range(EXPIRY, b"\x03")
            batch.put(COUNT, _U64.pack(0))
            self._write(batch)
            self._count = 0

    # -- reads -----------------------------------------------------------------------------

    def size(self) -> int:
        """Retained topics, including expired ones `clear_expired` has not removed yet. O(1): a
        counter kept in the same write batches as the messages."""
        self._check_open()
        return self._count

    def read(self, topic: str, now: int | None = None) -> Retained | None:
        """The topic's retained message, None if none or expired. Cost: one point read."""
        self._check_open()
        levels = rules.parse_topic(topic)
        raw = self.db.get(topic_key(levels))
        if raw is None:
            return None
        message = _decode_value(topic, raw)
        if _expired(message, now_ms() if now is None else now):
            return None
        return message

    def match(
        self, topic_filter: str, after: str | None = None, now: int | None = None
    ) -> Iterator[Retained]:
        """The retained messages matching the filter, in topic order, after topic `after` (the
        cursor: the last topic a previous call returned), as an iterator in constant memory.

        Cost: a seek, then a range scan of the filter's literal prefix (`a/b/#` reads only the
        topics under `a/b`); on a mismatch at a literal level after a `+` the scan seeks to the
        next candidate instead of reading on, so `+/x` reads about one key per first level
        rather than every topic. The filter is checked before the iterator is returned; the
        iterator reads the store as it was when it began (RocksDB's implicit iterator
        snapshot), so writes made while it runs are not seen; resume with `after` to see them.
        """
        self._check_open()
        levels = rules.parse_filter(topic_filter)
        start = None
        if after is not None:
            start = topic_key(rules.parse_topic(after))
        return self._scan(levels, start, now_ms() if now is None else now)

    def every(self) -> Iterator[Retained]:
        """Every retained message in topic order, `$` topics and expired ones not yet swept
        included (no filter, so no MQTT rule: for a partition's hand-off, not a subscriber);
        reads the store as it was when it began."""
        self._check_open()
        options = ReadOptions()
        options.set_iterate_upper_bound(EXPIRY)
        it = self.db.iter(options)
        it.seek(MESSAGES)
        while it.valid():
            self._check_open()
            key = bytes(it.key())
            yield _decode_value(_topic_of(key), bytes(it.value()))
            it.next()

    def page(
        self,
        topic_filter: str = "#",
        after: str | None = None,
        limit: int = 100,
        now: int | None = None,
    ) -> tuple[list[Retained], str | None]:
        """One page of `match` in topic order and the cursor of the next page (None once a page
        comes back short; a full last page gives a cursor whose page is empty). Page N costs
        what page 1 costs: the cursor is the last topic returned and the next page starts with
        a seek to it (keyset paging, no offset scan). Cost: O(log n + limit) for `#`."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise BadInput(f"limit must be in 1..10000, got {limit!r}")
        out: list[Retained] = []
        iterator = self.match(topic_filter, after, now)
        for message in iterator:
            out.append(message)
            if len(out) == limit:
                break
        else:
            return out, None
        return out, out[-1].topic

    def _point(self, levels: Levels, start: bytes | None, now: int) -> Iterator[Retained]:
        key = topic_key(levels)
        if start is None or key > start:
            raw = self.db.get(key)
            if raw is not None:
                message = _decode_value("/".join(levels), raw)
                if not _expired(message, now):
                    yield message

    def _scan(self, levels: Levels, start: bytes | None, now: int) -> Iterator[Retained]:
        """The matching records with key > start, seeking over what cannot match."""
        wild = next((i for i, level in enumerate(levels) if level in ("+", "#")), len(levels))
        if wild == len(levels):  # no wildcard: one point read
            yield from self._point(levels, start, now)
            return
        prefix_levels = [level.encode() for level in levels[:wild]]
        # Keys of topics whose first `wild` levels are the literal prefix: the key of the
        # prefix itself (for `a/#` matching `a`) and everything under `prefix\x00`.
        if wild:
            lower = MESSAGES + SEP.join(prefix_levels)
            upper = lower + b"\x01"
        else:
            lower, upper = MESSAGES, EXPIRY
        literal = [None if level in ("+", "#") else level.encode() for level in levels]
        dollar_guard = levels[0] in ("+", "#")
        options = ReadOptions()
        options.set_iterate_upper_bound(upper)
        it = self.db.iter(options)
        target = lower if start is None or start < lower else start
        it.seek(target)
        if it.valid() and start is not None and it.key() == start:
            it.next()
        while it.valid():
            self._check_open()
            key = bytes(it.key())
            parts = key[1:].split(SEP)
            if dollar_guard and parts[0].startswith(b"$"):
                it.seek(MESSAGES + b"%")  # past every `$` first level
                continue
            seek = _next_candidate(levels, literal, parts)
            if seek is None:
                message = _decode_value(_topic_of(key), bytes(it.value()))
                if not _expired(message, now):
                    yield message
                it.next()
            elif seek == b"":
                it.next()
            else:
                it.seek(MESSAGES + seek)


def _expires_at(write: Write, at: int) -> int | None:
    if write.expires_at is not None or write.expiry_interval_s is None:
        return write.expires_at
    return at + write.expiry_interval_s * 1000


def _next_candidate(
    levels: Levels, literal: list[bytes | None], parts: list[bytes]
) -> bytes | None:
    """None if the topic `parts` matches the filter; else where to seek next (without the
    message prefix; always after `parts`), or b"" to just step to the next key."""
    for i, level in enumerate(levels):
        if level == "#":
            return None
        if i >= len(parts):
            return b""  # topic shorter than the filter: deeper keys follow right after it
        want = literal[i]
        if want is None or want == parts[i]:
            continue
        if parts[i] < want:  # the next candidate has this level equal to `want`
            return SEP.join([*parts[:i], want])
        # Past `want` here: no topic starting with parts[:i] and a later level i can match;
        # they all sort before parts[:i] + b"\x01". i > 0: a literal first level bounds the
        # scan range.
        return SEP.join(parts[:i]) + b"\x01" if i else b""
    if len(parts) == len(levels):
        return None
    # Deeper than the filter: skip every topic under this one.
    return SEP.join(parts[: len(levels)]) + b"\x01"


def _expired(message: Retained, now: int) -> bool:
    return message.expires_at is not None and message.expires_at <= now
