"""Hypothesis stateful test: the stream store against a plain list of messages.

After any sequence of batches (synchronous or buffered), generation changes (with a layout
switch between `lts/1` and `reference/1` at restarts), drops, deletes and restarts, replaying
every filter from any start time returns exactly the matching messages, each once, in time
order per stream and in write order per topic (for equal timestamps), following the ranks;
iterators carried across a restart as strings continue where they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from relay_streams.model import Message
from relay_streams.settings import DbSettings
from relay_streams.shard import shard_of
from relay_streams.store import StreamStore
from relay_topics import rules

LEVELS = ["a", "b", "", "$s", "c"]
SHARDS = 2
topic_st = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3).map("/".join).filter(bool)
filter_st = st.one_of(
    st.just("#"),
    st.lists(st.sampled_from([*LEVELS, "+"]), min_size=1, max_size=3)
    .flatmap(lambda levels: st.sampled_from(["/".join(levels), "/".join([*levels, "#"])]))
    .filter(bool),
)


@dataclass(frozen=True)
class Stored:
    topic: str
    payload: bytes
    ts: int
    order: int


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class StreamsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # tmpfs when there is one: a real file system whose fsync is free, to keep this fast.
        shm = Path("/dev/shm")
        self.dir = Path(
            tempfile.mkdtemp(prefix="streams-model-", dir=shm if shm.is_dir() else None)
        )
        self.clock = Clock()
        self.settings = DbSettings(shards=SHARDS, lts_thresholds=(2, 1))
        self.store = StreamStore(self.dir, node="model", clock=self.clock)
        self.db = self.store.open_db("db", self.settings)
        self.model: dict[int, list[Stored]] = {1: []}
        self.current = 1
        self.counter = 0
        self.last_stamp = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- changes ---------------------------------------------------------------------------

    @rule(
        batch=st.lists(
            st.tuples(topic_st, st.one_of(st.none(), st.integers(0, 2_000))), max_size=6
        ),
        sync=st.booleans(),
    )
    def store_batch(self, batch: list[tuple[str, int | None]], sync: bool) -> None:
        messages: list[Message | tuple[str, bytes]] = []
        stamp = max(self.clock.now, self.last_stamp)
        for topic, ts in batch:
            self.counter += 1
            payload = b"%d" % self.counter
            messages.append((topic, payload) if ts is None else Message(topic, payload, ts))
            stored_ts = stamp if ts is None else ts
            self.model[self.current].append(Stored(topic, payload, stored_ts, self.counter))
        self.last_stamp = stamp
        self.db.store_batch(messages, sync=sync)

    @rule(ms=st.integers(0, 500))
    def tick(self, ms: int) -> None:
        self.clock.now += ms

    @rule()
    def add_generation(self) -> None:
        self.clock.now += 1
        info = self.db.add_generation()
        assert info.number == self.current + 1
        self.current = info.number
        self.model[self.current] = []

    @precondition(lambda self: len(self.model) > 1)
    @rule(data=st.data())
    def drop_generation(self, data: st.DataObject) -> None:
        closed = sorted(n for n in self.model if n != self.current)
        number = data.draw(st.sampled_from(closed))
        self.db.drop_generation(number)
        del self.model[number]

    @rule(topic_filter=filter_st, parity=st.sampled_from([None, 0, 1]))
    def delete(self, topic_filter: str, parity: int | None) -> None:
        flt = rules.parse_filter(topic_filter)

        def doomed(topic: str, payload: bytes) -> bool:
            if not rules.matches(flt, rules.parse_topic(topic)):
                return False
            return parity is None or int(payload) % 2 == parity

        expected = sum(doomed(m.topic, m.payload) for ms in self.model.values() for m in ms)
        predicate = None if parity is None else (lambda m: int(m.payload) % 2 == parity)
        assert self.db.delete(topic_filter, predicate) == expected
        for number, messages in self.model.items():
            self.model[number] = [m for m in messages if not doomed(m.topic, m.payload)]

    @rule(layout=st.sampled_from(["lts/1", "reference/1"]))
    def restart(self, layout: str) -> None:
        self._restart(layout)
        assert self.db.check() == []

    def _restart(self, layout: str | None = None) -> None:
        self.store.close()
        self.store = StreamStore(self.dir, node="model", clock=self.clock)
        if layout is not None:
            self.settings = DbSettings(shards=SHARDS, layout=layout, lts_thresholds=(2, 1))
        self.db = self.store.open_db("db", self.settings)
        self.last_stamp = 0

    # -- replay ----------------------------------------------------------------------------

    @rule(
        topic_filter=filter_st,
        start=st.integers(0, 2_500),
        n=st.integers(1, 4),
        restart_midway=st.booleans(),
    )
    def replay(self, topic_filter: str, start: int, n: int, restart_midway: bool) -> None:
        self.db.flush()
        ranked = self.db.get_streams(topic_filter, start)
        assert [r.rank for r in ranked] == sorted(r.rank for r in ranked)
        tokens = {r.stream.token(): None for r in ranked}  # no stream twice
        assert len(tokens) == len(ranked)
        got: dict[str, list[Message]] = defaultdict(list)
        iterators = {}
        for r in ranked:
            assert r.rank == (r.stream.shard, r.stream.generation)
            iterator = self.db.make_iterator(r.stream.token(), topic_filter, start).token()
            result = self.db.next(iterator, n)
            got[r.stream.token()] += result.messages
            iterators[r.stream.token()] = (result.iterator.token(), result.end_of_stream)
        if restart_midway:
            self._restart()
        for r in ranked:
            token, ended = iterators[r.stream.token()]
            while not ended:
                result = self.db.next(token, n)
                got[r.stream.token()] += result.messages
                token, ended = result.iterator.token(), result.end_of_stream
                if not result.messages and r.stream.generation == self.current:
                    break  # the open generation never ends
            assert ended or r.stream.generation == self.current

        flt = rules.parse_filter(topic_filter)
        expected = {
            m.payload: (number, m)
            for number, messages in self.model.items()
            for m in messages
            if m.ts >= start and rules.matches(flt, rules.parse_topic(m.topic))
        }
        seen = [m.payload for messages in got.values() for m in messages]
        assert sorted(seen) == sorted(expected), (topic_filter, start)
        for r in ranked:
            messages = got[r.stream.token()]
            stamps = [m.ts for m in messages]
            assert stamps == sorted(stamps)  # time order per stream
            for m in messages:
                number, stored = expected[m.payload]
                assert (m.topic, m.ts, number) == (stored.topic, stored.ts, r.stream.generation)
                assert shard_of(m.topic, SHARDS) == r.rank[0]
            # Per topic: write order for equal timestamps (ts, then write order).
            by_topic: dict[str, list[bytes]] = defaultdict(list)
            for m in messages:
                by_topic[m.topic].append(m.payload)
            for topic, payloads in by_topic.items():
                orders = [expected[p][1] for p in payloads]
                assert orders == sorted(orders, key=lambda s: (s.ts, s.order)), topic


StreamsMachine.TestCase.settings = hsettings(
    max_examples=int(os.environ.get("RELAY_MODEL_EXAMPLES", "50")),
    stateful_step_count=25,
    deadline=None,
)
TestStreamsModel = StreamsMachine.TestCase
