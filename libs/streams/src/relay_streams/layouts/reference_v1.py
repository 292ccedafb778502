"""Layout `reference/1`: one stream per shard and generation, records in time order.

Key: `0x02 | ts (u64 BE, ms) | seq (u64 BE)`; value: `base.encode_value`. Every filter gets the
one stream (static index 0) and each read decodes every topic to match it, so a narrow filter
costs a scan of everything. It is the baseline that `lts/1` must beat, and the simplest layout
to reason about (EMQX ships its `reference` layout for the same reasons).

Invariant: keys sort by (ts, seq), so a read from `start` is one range scan in time order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rocksdict import ColumnFamily, Rdict, WriteBatch

from relay_ds.tokens import Position, StaticIndex
from relay_streams import lts
from relay_streams.errors import BadInput, CorruptRecord
from relay_streams.layouts import base
from relay_streams.model import Message
from relay_topics import rules
from relay_topics.rules import Levels

LAYOUT_ID = "reference/1"
_STREAM = StaticIndex(0)
_END = base.MESSAGES[0] + 1


def create(options: dict[str, Any], previous: base.Layout | None) -> list[tuple[bytes, bytes]]:
    if options:
        raise BadInput(f"layout {LAYOUT_ID} takes no options, got {sorted(options)}")
    return []


def open(cf: Rdict, handle: ColumnFamily, options: dict[str, Any], where: str) -> Reference:
    return Reference(cf, handle, where)


class Reference:
    layout_id = LAYOUT_ID

    def __init__(self, cf: Rdict, handle: ColumnFamily, where: str) -> None:
        self.cf = cf
        self.handle = handle
        self.where = where

    def prepare(self, batch: WriteBatch, items: Sequence[tuple[Levels, Message, int]]) -> None:
        handle = self.handle
        for _, message, seq in items:
            key = base.MESSAGES + message.ts.to_bytes(8, "big") + seq.to_bytes(8, "big")
            batch.put(key, base.encode_value(message.topic, message.payload), handle)

    def reload(self) -> None:
        pass

    def closed(self) -> None:
        pass

    def streams(self, topic_filter: Levels) -> list[StaticIndex]:
        return [_STREAM]

    def every_stream(self) -> list[StaticIndex]:
        return [_STREAM]

    def has_stream(self, static: StaticIndex) -> bool:
        return static == _STREAM

    def read(
        self,
        static: StaticIndex,
        topic_filter: Levels | None,
        start: int,
        after: Position | None,
        limit: int,
    ) -> base.ReadResult:
        lower = base.MESSAGES + base.position_bytes(start, after)
        # Every topic is checked, even for '#' (which must still skip $-topics).
        return base.read_range(self.cf, lower, bytes([_END]), topic_filter, limit, self.where)

    def key(self, static: StaticIndex, position: Position) -> bytes:
        return base.MESSAGES + position.ts.to_bytes(8, "big") + position.seq.to_bytes(8, "big")

    def check(self, belongs: Callable[[str], bool]) -> base.Census:
        census = base.Census()
        for key, value in base.scan(self.cf, base.MESSAGES, bytes([_END])):
            where = f"{self.where} key {key.hex()}"
            if len(key) != 17:
                census.problems.append(f"{where}: message key has the wrong length")
                continue
            position = Position(int.from_bytes(key[1:9], "big"), int.from_bytes(key[9:], "big"))
            census.saw(position)
            try:
                message = base.decode_value(value, position.ts, self.where, key)
                rules.parse_topic(message.topic)
            except Exception as e:  # a check reports every kind of damage
                census.problems.append(str(e) if isinstance(e, CorruptRecord) else f"{where}: {e}")
                continue
            if not belongs(message.topic):
                census.problems.append(f"{where}: topic {message.topic!r} is in the wrong shard")
        return census

    def learned(self) -> lts.Trie | None:
        return None

    def describe(self, static: StaticIndex) -> str:
        return "#"

    def stream_count(self) -> int:
        return 1
