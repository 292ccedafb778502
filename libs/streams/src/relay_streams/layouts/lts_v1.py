"""Layout `lts/1`: streams from the learned topic structure (`relay_streams.lts`).

Records in the generation's column family:
- trie edge: `0x01 | parent node (u64 BE) | label UTF-8` -> `child node (u64 BE)`;
- message: `0x02 | static index (u64 BE) | ts (u64 BE, ms) | seq (u64 BE)` -> `base.encode_value`.

So one stream (all topics of one trie leaf) is one contiguous key range in time order, and a
read from `start` is a seek plus a range scan. A filter that leaves open every level the stream
varies on (`t7/dev/+` on the stream `t7/dev/+`) reads without decoding topics; otherwise each
topic is matched. Options: `{"thresholds": [100, 20]}` (see `DbSettings.lts_thresholds`).

Invariants:
- a message's trie edges are in the same write batch as the message, so after any crash every
  message key's static index is a leaf of the persisted trie;
- a new generation starts with the learned paths (those with a `+` edge) of the previous
  generation's trie, so it keeps the learned structure without the old concrete topics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rocksdict import ColumnFamily, Rdict, WriteBatch

from relay_ds.tokens import Position, StaticIndex
from relay_streams import lts
from relay_streams.errors import BadInput, BadToken, CorruptRecord
from relay_streams.layouts import base
from relay_streams.model import Message
from relay_topics import rules
from relay_topics.rules import Levels

LAYOUT_ID = "lts/1"
EDGES = b"\x01"
_KEY_LENGTH = 25
_KNOWN_TOPICS = 200_000  # topics remembered per generation and shard (~40 MB at most)


def _thresholds(options: dict[str, Any]) -> tuple[int, ...]:
    thresholds = options.get("thresholds")
    if (
        set(options) != {"thresholds"}
        or not isinstance(thresholds, list)
        or not thresholds
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in thresholds)
    ):
        raise BadInput(f"layout {LAYOUT_ID} needs options {{'thresholds': [int >= 1, ...]}}")
    return tuple(thresholds)


def _edge_record(edge: lts.Edge) -> tuple[bytes, bytes]:
    key = EDGES + edge.parent.to_bytes(8, "big") + edge.label.encode()
    return key, edge.child.to_bytes(8, "big")


def create(options: dict[str, Any], previous: base.Layout | None) -> list[tuple[bytes, bytes]]:
    _thresholds(options)
    trie = previous.learned() if previous is not None else None
    if trie is None:
        return []
    return [_edge_record(edge) for edge in trie.learned_paths()]


def open(cf: Rdict, handle: ColumnFamily, options: dict[str, Any], where: str) -> Lts:
    return Lts(cf, handle, _thresholds(options), where)


class Lts:
    layout_id = LAYOUT_ID

    def __init__(self, cf: Rdict, handle: ColumnFamily, thresholds: tuple[int, ...], where: str):
        self.cf = cf
        self.handle = handle
        self.thresholds = thresholds
        self.where = where
        self.trie = lts.Trie(thresholds)
        self.reload()

    def _edges(self) -> list[lts.Edge]:
        edges = []
        for key, value in base.scan(self.cf, EDGES, base.MESSAGES):
            try:
                label = key[9:].decode()
            except UnicodeDecodeError:
                raise lts.TrieError(f"trie edge {key.hex()} is damaged (label)") from None
            if len(key) < 9 or len(value) != 8:
                raise lts.TrieError(f"trie edge {key.hex()} is damaged (length)")
            parent = lts.NodeId(int.from_bytes(key[1:9], "big"))
            edges.append(lts.Edge(parent, label, lts.NodeId(int.from_bytes(value, "big"))))
        return edges

    def reload(self) -> None:
        trie = lts.Trie(self.thresholds)
        try:
            trie.load(self._edges())
        except lts.TrieError as e:
            raise CorruptRecord(f"{self.where}: {e}") from None
        self.trie = trie
        self._known: dict[str, int] = {}
        """Topic -> static index of topics already learned (a learned topic never moves)."""

    def closed(self) -> None:
        self._known = {}

    def prepare(self, batch: WriteBatch, items: Sequence[tuple[Levels, Message, int]]) -> None:
        handle = self.handle
        learn = self.trie.learn
        known = self._known
        for levels, message, seq in items:
            static = known.get(message.topic)
            if static is None:
                static, added = learn(levels)
                for edge in added:
                    key, value = _edge_record(edge)
                    batch.put(key, value, handle)
                if len(known) >= _KNOWN_TOPICS:
                    known.clear()
                known[message.topic] = static
            key = (
                base.MESSAGES
                + static.to_bytes(8, "big")
                + message.ts.to_bytes(8, "big")
                + seq.to_bytes(8, "big")
            )
            batch.put(key, base.encode_value(message.topic, message.payload), handle)

    def streams(self, topic_filter: Levels) -> list[StaticIndex]:
        return [StaticIndex(leaf.static) for leaf in self.trie.match(topic_filter)]

    def every_stream(self) -> list[StaticIndex]:
        return [StaticIndex(leaf.static) for leaf in self.trie.leaves()]

    def has_stream(self, static: StaticIndex) -> bool:
        return self.trie.leaf(static) is not None

    def read(
        self,
        static: StaticIndex,
        topic_filter: Levels | None,
        start: int,
        after: Position | None,
        limit: int,
    ) -> base.ReadResult:
        leaf = self.trie.leaf(static)
        if leaf is None:
            raise BadToken(f"{self.where} has no stream {static}")
        prefix = base.MESSAGES + static.to_bytes(8, "big")
        lower = prefix + base.position_bytes(start, after)
        upper = base.MESSAGES + (static + 1).to_bytes(8, "big")
        check = None if topic_filter is None or leaf.covered_by(topic_filter) else topic_filter
        return base.read_range(self.cf, lower, upper, check, limit, self.where)

    def key(self, static: StaticIndex, position: Position) -> bytes:
        return (
            base.MESSAGES
            + static.to_bytes(8, "big")
            + position.ts.to_bytes(8, "big")
            + position.seq.to_bytes(8, "big")
        )

    def check(self, belongs: Callable[[str], bool]) -> base.Census:
        census = base.Census()
        try:
            trie = lts.Trie(self.thresholds)
            trie.load(self._edges())
        except lts.TrieError as e:
            census.problems.append(f"{self.where}: {e}")
            return census
        for key, value in base.scan(self.cf, base.MESSAGES, bytes([base.MESSAGES[0] + 1])):
            where = f"{self.where} key {key.hex()}"
            if len(key) != _KEY_LENGTH:
                census.problems.append(f"{where}: message key has the wrong length")
                continue
            static = int.from_bytes(key[1:9], "big")
            position = Position(int.from_bytes(key[9:17], "big"), int.from_bytes(key[17:], "big"))
            census.saw(position)
            try:
                message = base.decode_value(value, position.ts, self.where, key)
                levels = rules.parse_topic(message.topic)
            except Exception as e:  # a check reports every kind of damage
                census.problems.append(str(e) if isinstance(e, CorruptRecord) else f"{where}: {e}")
                continue
            if trie.lookup(levels) != static:
                census.problems.append(
                    f"{where}: topic {message.topic!r} is not in stream {static} of the trie"
                )
            if not belongs(message.topic):
                census.problems.append(f"{where}: topic {message.topic!r} is in the wrong shard")
        return census

    def learned(self) -> lts.Trie | None:
        return self.trie

    def describe(self, static: StaticIndex) -> str:
        leaf = self.trie.leaf(static)
        return "?" if leaf is None else "/".join(leaf.path)

    def stream_count(self) -> int:
        return len(self.trie)
