"""What changed in a retainer partition since a whole copy of it was taken (decision 0022, "A
changes-only catch-up"): a watch per partition, told of every retained topic written or
expired and every stream message stored, so that a hand-off's pause and catch-up cost the
writes made since the prefetch, not the partition's size.

A watch starts before the whole copy is collected (`Watches.start`), records what is written
while the collection runs, and is `settle`d once the collection is done, with the writers held
(nothing written meanwhile): the retained topics written during the collection are read again,
and each stream topic appended to is read again from the earliest ts appended (a message is
stored at its ts, so everything appended since the watch started is at or after it). That
makes the copy exact, and from then on the watch's `Digests` follow every write, one hash each.

`Changes` are what a watch saw since it settled: the retained topics written (their message
now, or their deletion) and the stream messages stored, in order. Installed over the copy they
are since (`install`), they give the source's state, and the target's own watch follows them
the same way, so both digests can be compared without collecting either partition.

Invariants:
- a settled watch's `digest` equals `partition_state.digest` of a collection made at the same
  moment, as long as it was told of every write of its partition (the retainer's writers and
  its expiry sweep tell it: `relay_retainer.retained`, `relay_retainer.streams`);
- a watch that saw more than `MAX_APPENDED_BYTES` of stream payloads since it settled is
  stale: it keeps no changes, and a catch-up pulls the whole partition;
- `from_json` refuses anything malformed, and any topic of another partition, with
  `ValueError` before `install` changes anything. Pure but for the stores it is handed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from relay_durable import codec
from relay_streams import partition_state
from relay_streams.model import Message
from relay_streams.partition_state import Belongs, Digests, PartitionState
from relay_streams.retained import Retained, RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore

MAX_APPENDED_BYTES = 64 << 20
"""Stream payload bytes a watch keeps for its changes; past it the watch is stale."""


@dataclass(frozen=True)
class Changes:
    partition: int
    partitions: int
    since: str
    """The name of the whole copy they are since (its watch's token)."""
    mark: str
    digest: str
    """Of the whole partition once they are installed."""
    retained: tuple[Retained, ...]
    """The retained topics written since, as they are now."""
    deleted: tuple[str, ...]
    """Retained topics written since that hold no message now."""
    appended: tuple[tuple[str, Message], ...]
    """Stream messages stored since, in order: (database, message)."""


@dataclass(frozen=True)
class Reread:
    """`Watch.reread`: the retained topics written during a collection as they stood after
    it (None: no message), and each stream topic appended to, from the earliest ts appended
    (at or after which every message appended meanwhile is stored)."""

    retained: dict[str, Retained | None]
    tails: dict[tuple[str, str], tuple[int, list[Message]]]

    def apply(self, state: PartitionState) -> PartitionState:
        kept = {m.topic: m for m in state.retained}
        for topic, now in self.retained.items():
            if now is None:
                kept.pop(topic, None)
            else:
                kept[topic] = now
        by_key: dict[tuple[str, str], list[Message]] = {}
        for db, messages in state.streams:
            for m in messages:
                by_key.setdefault((db, m.topic), []).append(m)
        for (db, topic), (start, tail) in self.tails.items():
            before = [m for m in by_key.get((db, topic), []) if m.ts < start]
            by_key[db, topic] = before + tail
        dbs: dict[str, list[Message]] = {}
        for db, topic in sorted(by_key):
            dbs.setdefault(db, []).extend(by_key[db, topic])
        return PartitionState(
            state.partition,
            state.partitions,
            state.mark,
            tuple(kept[topic] for topic in sorted(kept)),
            tuple((db, tuple(messages)) for db, messages in sorted(dbs.items()) if messages),
        )


@dataclass
class Watch:
    partition: int
    partitions: int
    token: str
    digests: Digests | None = None
    """None until `settle`."""
    touched: set[str] = field(default_factory=set)
    appended: list[tuple[str, Message]] = field(default_factory=list)
    unordered: set[tuple[str, str]] = field(default_factory=set)
    """Stream topics whose chain must be made again from the store (`Digests.append`)."""
    appended_bytes: int = 0
    stale: bool = False

    @property
    def ready(self) -> bool:
        return self.digests is not None and not self.stale

    def touch(self, topics: Iterable[str]) -> None:
        self.touched.update(topics)

    def append(self, db: str, messages: list[Message]) -> None:
        if self.stale:
            return
        self.appended += [(db, m) for m in messages]
        self.appended_bytes += sum(len(m.payload) for m in messages)
        if self.appended_bytes > MAX_APPENDED_BYTES:
            self.stale = True
            self.appended.clear()
            return
        if self.digests is not None:
            self.unordered |= self.digests.append(db, messages)

    def settle(
        self, state: PartitionState, retained: RetainedStore, streams: StreamStore
    ) -> PartitionState:
        """`reread` then `Reread.apply` (the retainer runs the second once its writers run
        again)."""
        return self.reread(retained, streams).apply(state)

    def reread(self, retained: RetainedStore, streams: StreamStore) -> Reread:
        """What was written since this watch started, read again from the stores, which
        nothing may change while this runs: applied to a copy collected since the watch
        started, it makes that copy exact as the stores stood here. What is told from then on
        is what changed since (`follow` gives the digests)."""
        found = {topic: retained.read(topic, now=0) for topic in self.touched}
        since: dict[tuple[str, str], int] = {}
        for db, m in self.appended:
            since[db, m.topic] = min(m.ts, since.get((db, m.topic), m.ts))
        tails = {
            (db, topic): (start, streams.open_db(db).topic_tail(topic, start))
            for (db, topic), start in since.items()
        }
        self._reset()
        return Reread(found, tails)

    def follow(self, digests: Digests) -> None:
        """Follow the copy `settle` returned, of which `digests` are (`Digests.of`, computed
        once the writers run again): the writes told since are applied to them."""
        for db, message in self.appended:
            self.unordered |= digests.append(db, (message,))
        self.digests = digests

    def rebase(self, state: PartitionState) -> None:
        """Follow `state`, the partition as it stands now (nothing writes it meanwhile)."""
        self._reset()
        self.follow(Digests.of(state))

    def _reset(self) -> None:
        self.touched.clear()
        self.appended.clear()
        self.unordered.clear()
        self.appended_bytes = 0
        self.stale = False

    def refresh(self, retained: RetainedStore, streams: StreamStore) -> Digests:
        """The digests, with the retained topics written since read again (a write tells
        the topic only), and the stream topics appended to out of ts order read again whole;
        `ValueError` before `follow`."""
        return self._refreshed(retained, streams)[0]

    def _refreshed(
        self, retained: RetainedStore, streams: StreamStore
    ) -> tuple[Digests, dict[str, Retained | None]]:
        """`refresh`, and the retained topics written since as they are now."""
        if self.digests is None:
            raise ValueError("the watch has not settled")
        for db, topic in self.unordered:
            self.digests.restart(db, topic, streams.open_db(db).topic_tail(topic, 0))
        self.unordered.clear()
        found = {topic: retained.read(topic, now=0) for topic in sorted(self.touched)}
        for topic, now in found.items():
            if now is None:
                self.digests.retained.pop(topic, None)
            else:
                self.digests.retained[topic] = partition_state.retained_digest(now)
        return self.digests, found

    def changes(self, retained: RetainedStore, streams: StreamStore, mark: str) -> Changes:
        """What changed since this watch settled; `ValueError` if it cannot say (stale)."""
        if not self.ready:
            raise ValueError("the watch is stale or has not settled")
        digests, found = self._refreshed(retained, streams)
        return Changes(
            self.partition,
            self.partitions,
            self.token,
            mark,
            digests.whole(self.partition, self.partitions),
            tuple(m for m in found.values() if m is not None),
            tuple(topic for topic, m in found.items() if m is None),
            tuple(self.appended),
        )


class Watches:
    """The watches of one retainer, by partition; `partition_of`: a topic's partition."""

    def __init__(self, partitions: int, partition_of: Callable[[str], int]) -> None:
        self.partitions = partitions
        self.partition_of = partition_of
        self._by_partition: dict[int, Watch] = {}

    def start(self, partition: int, token: str | None = None) -> Watch:
        watch = Watch(partition, self.partitions, token or secrets.token_hex(8))
        self._by_partition[partition] = watch
        return watch

    def get(self, partition: int) -> Watch | None:
        return self._by_partition.get(partition)

    def stop(self, partition: int) -> None:
        self._by_partition.pop(partition, None)

    def touched(self, topics: Iterable[str]) -> None:
        """Retained topics written or expired (durably)."""
        if self._by_partition:
            for topic in topics:
                watch = self._by_partition.get(self.partition_of(topic))
                if watch is not None:
                    watch.touch((topic,))

    def appended(self, db: str, messages: list[Message]) -> None:
        """Stream messages stored (durably), as stored, in order."""
        if not self._by_partition:
            return
        mine: dict[int, list[Message]] = {}
        for m in messages:
            partition = self.partition_of(m.topic)
            if partition in self._by_partition:
                mine.setdefault(partition, []).append(m)
        for partition, found in mine.items():
            self._by_partition[partition].append(db, found)


def install(
    retained: RetainedStore,
    streams: StreamStore,
    changes: Changes,
    watch: Watch,
    new_db: DbSettings,
) -> int:
    """Install `changes` over the copy `watch` follows (durable when this returns), and make
    the watch follow them; the number of writes."""
    position = partition_state.position(changes.partition, changes.mark)
    writes = [Write(m.topic, m.payload, m.qos, None, m.ts, m.expires_at) for m in changes.retained]
    writes += [Write(topic, b"") for topic in changes.deleted]
    for chunk in partition_state.chunks(writes):
        retained.store_many(chunk, positions=[position] * len(chunk))
    watch.touch(m.topic for m in changes.retained)
    watch.touch(changes.deleted)
    run: list[Message] = []
    for n, (db, message) in enumerate(changes.appended):
        run.append(message)
        if n + 1 == len(changes.appended) or changes.appended[n + 1][0] != db:
            if db not in streams.storages():
                streams.open_db(db, new_db)
            for chunk in partition_state.chunks(run):
                stored = streams.store_batch(db, chunk, True, [position] * len(chunk))
                watch.append(db, stored)
            run = []
    return len(writes) + len(changes.appended)


# -- JSON ----------------------------------------------------------------------------------


def to_json(changes: Changes) -> dict[str, Any]:
    return {
        "format": partition_state.FORMAT,
        "changes": True,
        "partition": changes.partition,
        "partitions": changes.partitions,
        "since": changes.since,
        "mark": changes.mark,
        "digest": changes.digest,
        "retained": [partition_state.retained_row(m) for m in changes.retained],
        "deleted": list(changes.deleted),
        "appended": [[db, m.topic, m.ts, codec.b64u(m.payload)] for db, m in changes.appended],
    }


def from_json(data: Any, belongs: Belongs) -> Changes:
    """The changes `data` carries (`to_json`'s form); `ValueError` for anything else."""
    if not isinstance(data, dict) or data.get("changes") is not True:
        raise ValueError("changes are a JSON object with changes: true")
    partition, partitions, mark = partition_state.header(data)
    since, digest = data.get("since"), data.get("digest")
    if not isinstance(since, str) or not since or not isinstance(digest, str):
        raise ValueError("changes name the copy they are since and the digest they give")
    retained = partition_state.retained_rows(data.get("retained"), belongs)
    raw_deleted = data.get("deleted")
    if not isinstance(raw_deleted, list):
        raise ValueError("deleted must be a list of topics")
    deleted = tuple(
        partition_state.topic(t, f"deleted[{i}]", belongs) for i, t in enumerate(raw_deleted)
    )
    if {m.topic for m in retained} & set(deleted):
        raise ValueError("a topic is both written and deleted")
    raw_appended = data.get("appended")
    if not isinstance(raw_appended, list):
        raise ValueError("appended must be a list")
    appended = []
    for i, entry in enumerate(raw_appended):
        where = f"appended[{i}]"
        if not isinstance(entry, list) or len(entry) != 4:
            raise ValueError(f"{where} must be [database, topic, ts, payload]")
        db = partition_state.database(entry[0])
        message = partition_state.stream_row(entry[1:], where, belongs)
        appended.append((db, message))
    return Changes(partition, partitions, since, mark, digest, retained, deleted, tuple(appended))
