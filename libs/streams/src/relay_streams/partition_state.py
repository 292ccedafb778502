"""One publication partition's data at a retainer, as a unit: collected from the retained
store and the stream store, digested, carried as JSON, and installed into another retainer's
stores (decision 0022, the retainer's hand-off).

A partition's data is every retained message and every durable-stream message whose topic
belongs to it (the caller's `belongs`: `relay_bus.routing.partition_of_topic`; every write of
a topic arrives on that topic's partition, so no other partition's records change them), plus
the partition's mark (`<broker epoch>:<first offset not applied>`, the highest position the
stores' marks record for it: `relay_streams.marks`).

Invariants:
- `digest` is a pure function of that data: two retainers holding the same messages of a
  partition give the same digest, and any difference in a retained message (topic, payload,
  qos, ts, expiry) or in a stream message (database, topic, ts, payload, or the order of a
  topic's messages) gives another one (SHA-256 over a canonical, length-prefixed encoding of
  each retained topic's digest and each stream topic's chain: `Digests`, which a watch keeps
  up to date write by write).
  The mark is not in it: a retainer resumes a partition from its group's committed offset,
  not from its stores' marks (which only cut exports), and an install that writes nothing
  records no mark;
- `install` goes through the stores' own writes (`store_many`, `store_batch`, `delete`), never
  their files, and replaces the partition's data on the target as a whole: installing the
  same state twice gives the same state (the digest after it equals the source's), other
  partitions' topics are not touched, and only what differs is written (a catch-up over a
  prefetched copy rewrites the messages changed since);
- installed writes carry the state's mark (`relay_streams.marks`), so an export of the target
  cuts the partition where the source stood; a state without a mark makes the target's marks
  incomplete, as any write of unknown position does;
- `from_json` refuses anything malformed, and any topic of another partition, with
  `ValueError` before `install` changes anything.

Caveat: stream messages are installed into the target's current generation of each database
(as a restore places archived messages), so a stream iterator handed out by the source may
not resume at the same place on the target.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from relay_durable import codec
from relay_streams import catalog
from relay_streams.errors import BadInput
from relay_streams.marks import Mark
from relay_streams.model import Message
from relay_streams.retained import Retained, RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore

FORMAT = 1
"""Version of the JSON form (`to_json`)."""
CHUNK = 1024
"""Writes per store call of an install (each is one synced batch)."""

Belongs = Callable[[str], bool]
"""Whether a topic is of the partition in hand."""
_Key = tuple[str, int, bytes]
"""A stream message as the install compares them: topic, ts, payload."""


@dataclass(frozen=True)
class PartitionState:
    partition: int
    partitions: int
    mark: str
    """`<epoch>:<offset>`, or "" when no store records a position of the partition."""
    retained: tuple[Retained, ...]
    """In topic order."""
    streams: tuple[tuple[str, tuple[Message, ...]], ...]
    """(database, its messages of the partition by topic, each topic's in stream order), in
    database order; databases without such messages are left out."""


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def _int(value: int | None) -> bytes:
    return b"-" if value is None else str(value).encode()


def retained_digest(message: Retained) -> bytes:
    h = hashlib.sha256()
    m = message
    for part in (m.topic.encode(), m.payload, _int(m.qos), _int(m.ts), _int(m.expires_at)):
        h.update(_field(part))
    return h.digest()


def chained(previous: bytes | None, db: str, message: Message) -> bytes:
    """The digest of a stream topic's messages up to `message`, from the digest of those
    before it (None: it is the first): a chain, so appending costs one hash."""
    if previous is None:
        previous = hashlib.sha256(_field(db.encode()) + _field(message.topic.encode())).digest()
    tail = _field(_int(message.ts)) + _field(message.payload)
    return hashlib.sha256(previous + tail).digest()


@dataclass
class Digests:
    """What a partition's digest is made of, per key: each retained topic's message, and each
    (database, stream topic)'s chain and message count. Kept up to date by a watch
    (`relay_streams.partition_watch`) as writes come, so a digest costs the keys, not the
    messages."""

    retained: dict[str, bytes]
    streams: dict[tuple[str, str], tuple[bytes, int, int]]
    """(database, topic) → (chain, messages, the last one's ts)."""

    @classmethod
    def of(cls, state: PartitionState) -> Digests:
        digests = cls({m.topic: retained_digest(m) for m in state.retained}, {})
        for db, messages in state.streams:
            digests.append(db, messages)
        return digests

    def append(self, db: str, messages: Iterable[Message]) -> set[tuple[str, str]]:
        """Extend the chains with messages stored after those they cover; the keys of any
        stored with a ts before their topic's last (the store puts it before: the chain must
        be made again from the store, `restart`)."""
        unordered = set()
        for message in messages:
            key = (db, message.topic)
            chain, count, last = self.streams.get(key, (None, 0, 0))
            if message.ts < last:
                unordered.add(key)
            self.streams[key] = (chained(chain, db, message), count + 1, message.ts)
        return unordered

    def restart(self, db: str, topic: str, messages: list[Message]) -> None:
        """The chain of (db, topic) made again from its messages, in stream order."""
        self.streams.pop((db, topic), None)
        self.append(db, messages)

    def whole(self, partition: int, partitions: int) -> str:
        h = hashlib.sha256()
        for part in (b"retainer-partition/2", _int(partition), _int(partitions)):
            h.update(_field(part))
        h.update(_field(_int(len(self.retained))))
        for topic in sorted(self.retained):
            h.update(_field(topic.encode()) + self.retained[topic])
        h.update(_field(_int(len(self.streams))))
        for db, topic in sorted(self.streams):
            h.update(_field(db.encode()) + _field(topic.encode()) + self.streams[db, topic][0])
        return h.hexdigest()

    def summary(self, partition: int, partitions: int, mark: str) -> dict[str, Any]:
        return {
            "partition": partition,
            "mark": mark,
            "digest": self.whole(partition, partitions),
            "retained": len(self.retained),
            "messages": sum(count for _, count, _ in self.streams.values()),
        }


def digest(state: PartitionState) -> str:
    return Digests.of(state).whole(state.partition, state.partitions)


def _stream_messages(store: StreamStore, db: str, belongs: Belongs) -> list[Message]:
    """The partition's messages of one database, by topic, each topic's in stream order."""
    found = [m for page in store.open_db(db).every_message() for m in page if belongs(m.topic)]
    found.sort(key=lambda m: m.topic)  # stable: each topic's messages keep their order
    return found


def mark(retained: RetainedStore, streams: StreamStore, partition: int, epoch: str) -> str:
    """The partition's mark: the highest position of log `epoch` the stores record for it."""
    every = [retained.marks]
    for db in streams.storages():
        every.extend(streams.open_db(db).marks())
    offsets = []
    for marks in every:
        found = marks.positions.get(partition)
        if found is not None and found[0] == epoch:
            offsets.append(found[1])
    return f"{epoch}:{max(offsets)}" if offsets else ""


def collect(
    retained: RetainedStore,
    streams: StreamStore,
    partition: int,
    partitions: int,
    belongs: Belongs,
    epoch: str,
) -> PartitionState:
    """The partition's data as it stands (a snapshot only while nothing writes it: a partition
    this retainer does not serve, or whose writes have settled); `epoch`: the broker's, whose
    positions make the mark."""
    kept = tuple(m for m in retained.every() if belongs(m.topic))
    dbs = []
    for db in sorted(streams.storages()):
        messages = _stream_messages(streams, db, belongs)
        if messages:
            dbs.append((db, tuple(messages)))
    at = mark(retained, streams, partition, epoch)
    return PartitionState(partition, partitions, at, kept, tuple(dbs))


def empty(partition: int, partitions: int) -> PartitionState:
    return PartitionState(partition, partitions, "", (), ())


def position(partition: int, mark: str) -> Mark | None:
    """The log position installed writes carry: the unit's mark (None: unknown)."""
    if not mark:
        return None
    epoch, _, offset = mark.rpartition(":")
    return Mark(partition, epoch, int(offset))


def chunks(items: list[Any]) -> Iterable[list[Any]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _install_retained(
    store: RetainedStore, state: PartitionState, belongs: Belongs, at: Mark | None
) -> int:
    held = {m.topic: m for m in store.every() if belongs(m.topic)}
    offered = {m.topic: m for m in state.retained}
    writes = [Write(topic, b"") for topic in held if topic not in offered]
    writes += [
        Write(m.topic, m.payload, m.qos, None, m.ts, m.expires_at)
        for m in state.retained
        if held.get(m.topic) != m
    ]
    for chunk in chunks(writes):
        store.store_many(chunk, positions=[at] * len(chunk))
    return len(writes)


def _install_stream(
    store: StreamStore,
    db: str,
    messages: tuple[Message, ...],
    belongs: Belongs,
    at: Mark | None,
    new_db: DbSettings,
) -> int:
    """Make the partition's messages of `db` be `messages`: a topic whose messages differ in
    any way is deleted and written again whole (so its order is the source's)."""
    if db not in store.storages():
        if not messages:
            return 0
        store.open_db(db, new_db)
    database = store.open_db(db)
    held: dict[str, list[_Key]] = {}
    for m in _stream_messages(store, db, belongs):
        held.setdefault(m.topic, []).append((m.topic, m.ts, m.payload))
    offered: dict[str, list[_Key]] = {}
    for m in messages:
        offered.setdefault(m.topic, []).append((m.topic, m.ts, m.payload))
    differ = {
        topic for topic in held.keys() | offered.keys() if held.get(topic) != offered.get(topic)
    }
    if not differ:
        return 0
    if differ & held.keys():
        database.delete(None, lambda m: m.topic in differ and m.topic in held)
    written = [m for m in messages if m.topic in differ]
    for chunk in chunks(written):
        database.store_batch(chunk, True, [at] * len(chunk))
    return len(written)


def install(
    retained: RetainedStore,
    streams: StreamStore,
    state: PartitionState,
    belongs: Belongs,
    new_db: DbSettings,
) -> int:
    """Make the stores hold exactly `state` for its partition (durable when this returns);
    the number of messages written or deleted. `new_db`: settings of a database the state
    has and this store does not."""
    at = position(state.partition, state.mark)
    changed = _install_retained(retained, state, belongs, at)
    offered = dict(state.streams)
    for db in sorted(set(streams.storages()) | offered.keys()):
        changed += _install_stream(streams, db, offered.get(db, ()), belongs, at, new_db)
    return changed


def summary(state: PartitionState) -> dict[str, Any]:
    return Digests.of(state).summary(state.partition, state.partitions, state.mark)


# -- JSON ----------------------------------------------------------------------------------


def to_json(state: PartitionState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "partition": state.partition,
        "partitions": state.partitions,
        "mark": state.mark,
        "digest": digest(state),
        "retained": [retained_row(m) for m in state.retained],
        "streams": {
            db: [[m.topic, m.ts, codec.b64u(m.payload)] for m in messages]
            for db, messages in state.streams
        },
    }


def retained_row(m: Retained) -> list[Any]:
    return [m.topic, codec.b64u(m.payload), m.qos, m.ts, m.expires_at]


def _number(value: Any, what: str, low: int = 0, high: int = 1 << 63) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
        raise ValueError(f"{what} must be an integer in {low}..{high - 1}")
    return value


def _payload(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be base64url text")
    try:
        return codec.unb64u(value)
    except ValueError:
        raise ValueError(f"{what} is not base64url") from None


def topic(value: Any, what: str, belongs: Belongs) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a topic")
    if not belongs(value):
        raise ValueError(f"{what} {value!r} is not of this partition")
    return value


def retained_rows(raw: Any, belongs: Belongs) -> tuple[Retained, ...]:
    """`retained_row`s, distinct and in topic order."""
    if not isinstance(raw, list):
        raise ValueError("retained must be a list")
    out = []
    for i, entry in enumerate(raw):
        where = f"retained[{i}]"
        if not isinstance(entry, list) or len(entry) != 5:
            raise ValueError(f"{where} must be [topic, payload, qos, ts, expires_at]")
        name = topic(entry[0], f"{where} topic", belongs)
        payload = _payload(entry[1], f"{where} payload")
        if not payload:
            raise ValueError(f"{where} payload is empty (an empty payload is no message)")
        qos = _number(entry[2], f"{where} qos", 0, 3)
        ts = _number(entry[3], f"{where} ts", 0, 1 << 53)
        until = None if entry[4] is None else _number(entry[4], f"{where} expires_at", 1)
        out.append(Retained(name, payload, qos, ts, until))
    topics = [m.topic for m in out]
    if topics != sorted(set(topics)):
        raise ValueError("retained topics must be distinct and in topic order")
    return tuple(out)


def database(name: Any) -> str:
    try:
        return catalog.parse_name(name)
    except BadInput as error:
        raise ValueError(f"database {name!r}: {error}") from None


def stream_row(entry: Any, where: str, belongs: Belongs) -> Message:
    """A stream message as JSON carries it: [topic, ts, payload]."""
    if not isinstance(entry, list) or len(entry) != 3:
        raise ValueError(f"{where} must be [topic, ts, payload]")
    name = topic(entry[0], f"{where} topic", belongs)
    ts = _number(entry[1], f"{where} ts", 0, 1 << 63)
    return Message(name, _payload(entry[2], f"{where} payload"), ts)


def _streams(raw: Any, belongs: Belongs) -> tuple[tuple[str, tuple[Message, ...]], ...]:
    if not isinstance(raw, dict):
        raise ValueError("streams must be an object of database: messages")
    out = []
    for db in sorted(raw):
        database(db)
        entries = raw[db]
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"streams[{db!r}] must be a non-empty list")
        messages = []
        for i, entry in enumerate(entries):
            messages.append(stream_row(entry, f"streams[{db!r}][{i}]", belongs))
        topics = [m.topic for m in messages]
        if topics != sorted(topics):
            raise ValueError(f"streams[{db!r}] must list its messages by topic")
        out.append((db, tuple(messages)))
    return tuple(out)


def _mark_of(mark: Any) -> str:
    if isinstance(mark, str):
        epoch, colon, offset = mark.rpartition(":")
        if mark == "" or (colon and epoch and offset.isdigit()):
            return mark
    raise ValueError('mark must be "" or "<epoch>:<offset>"')


def header(data: dict[str, Any]) -> tuple[int, int, str]:
    """A unit's partition, partition count and mark, its format checked."""
    if data.get("format") != FORMAT:
        raise ValueError(f"format must be {FORMAT}")
    partitions = _number(data.get("partitions"), "partitions", 1, 1 << 16)
    partition = _number(data.get("partition"), "partition", 0, partitions)
    return partition, partitions, _mark_of(data.get("mark"))


def from_json(data: Any, belongs: Belongs) -> PartitionState:
    """The state `data` carries (`to_json`'s form); `ValueError` for anything else, a digest
    not its own included. `belongs`: the topics of the partition it claims."""
    if not isinstance(data, dict):
        raise ValueError("a partition state is a JSON object")
    partition, partitions, mark = header(data)
    state = PartitionState(
        partition,
        partitions,
        mark,
        retained_rows(data.get("retained"), belongs),
        _streams(data.get("streams"), belongs),
    )
    if data.get("digest") != digest(state):
        raise ValueError("digest does not match the state it comes with")
    return state
