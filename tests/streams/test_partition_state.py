"""A retainer partition's data as a unit (`relay_streams.partition_state`): collected, carried
as JSON and installed into real RocksDB stores of another retainer."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_bus.routing import partition_of_topic
from relay_streams import partition_state
from relay_streams.marks import Mark
from relay_streams.model import Message
from relay_streams.retained import RetainedStore, Write
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore

PARTITIONS = 4
EPOCH = "e1"
NEW_DB = DbSettings(shards=2)
TOPICS = [f"t/{i}" for i in range(12)] + ["$sys/a", "$sys/b"]


def belongs(partition: int):  # type: ignore[no-untyped-def]
    return lambda topic: partition_of_topic(topic, PARTITIONS) == partition


def p_of(topic: str) -> int:
    return partition_of_topic(topic, PARTITIONS)


@contextmanager
def stores(root: Path) -> Iterator[tuple[RetainedStore, StreamStore]]:
    retained = RetainedStore(root / "retained")
    streams = StreamStore(root / "streams", node="test")
    try:
        yield retained, streams
    finally:
        streams.close()
        retained.close()


def fill(
    retained: RetainedStore,
    streams: StreamStore,
    kept: dict[str, bytes],
    messages: dict[str, list[tuple[str, int, bytes]]],
    offset: int = 10,
) -> None:
    writes = [
        Write(topic, payload, 1, 60, 1000 + i) for i, (topic, payload) in enumerate(kept.items())
    ]
    if writes:
        retained.store_many(writes, positions=[Mark(p_of(w.topic), EPOCH, offset) for w in writes])
    for db, found in messages.items():
        database = streams.open_db(db, NEW_DB)
        batch = [Message(topic, payload, ts) for topic, ts, payload in found]
        if batch:
            marks = [Mark(p_of(m.topic), EPOCH, offset) for m in batch]
            database.store_batch(batch, True, marks)


def collect(
    retained: RetainedStore, streams: StreamStore, p: int
) -> partition_state.PartitionState:
    return partition_state.collect(retained, streams, p, PARTITIONS, belongs(p), EPOCH)


def test_a_partition_moves_whole_and_other_partitions_stay(tmp_path: Path) -> None:
    source_kept = {topic: f"v-{topic}".encode() for topic in TOPICS}
    source_messages = {"m": [(t, 5 + i, f"{t}#{i}".encode()) for i in range(3) for t in TOPICS]}
    target_kept = {topic: b"target" for topic in TOPICS[:6]}
    target_messages = {"m": [(t, 1, b"old") for t in TOPICS], "other": [("t/1", 2, b"x")]}
    with (
        stores(tmp_path / "source") as (s_ret, s_str),
        stores(tmp_path / "target") as (t_ret, t_str),
    ):
        fill(s_ret, s_str, source_kept, source_messages, offset=40)
        fill(t_ret, t_str, target_kept, target_messages, offset=7)
        for p in range(PARTITIONS):
            state = collect(s_ret, s_str, p)
            if state.retained:
                break
        assert state.retained
        assert state.streams
        assert state.mark == f"{EPOCH}:40"
        assert {m.topic for m in state.retained} == {t for t in TOPICS if p_of(t) == p}
        before_others = [collect(t_ret, t_str, q) for q in range(PARTITIONS) if q != p]

        unit = json.loads(json.dumps(partition_state.to_json(state)))
        offered = partition_state.from_json(unit, belongs(p))
        assert offered == state
        assert partition_state.install(t_ret, t_str, offered, belongs(p), NEW_DB) > 0

        assert partition_state.digest(collect(t_ret, t_str, p)) == partition_state.digest(state)
        assert [collect(t_ret, t_str, q) for q in range(PARTITIONS) if q != p] == before_others
        assert partition_state.install(t_ret, t_str, offered, belongs(p), NEW_DB) == 0
        assert partition_state.digest(collect(t_ret, t_str, p)) == partition_state.digest(state)
        assert t_ret.marks.positions[p] == (EPOCH, 40)

        # expiry carried exactly, `$` topics included, a database the target lacked made
        moved = {m.topic: m for m in t_ret.every() if p_of(m.topic) == p}
        assert moved == {m.topic: m for m in state.retained}
        assert all(m.expires_at == m.ts + 60_000 for m in moved.values())

        # forgetting: the empty state removes the partition's data and nothing else
        empty = partition_state.empty(p, PARTITIONS)
        partition_state.install(t_ret, t_str, empty, belongs(p), NEW_DB)
        after = collect(t_ret, t_str, p)
        assert (after.retained, after.streams) == ((), ())
        assert [collect(t_ret, t_str, q) for q in range(PARTITIONS) if q != p] == before_others


def test_dollar_topics_are_carried(tmp_path: Path) -> None:
    with stores(tmp_path / "s") as (s_ret, s_str), stores(tmp_path / "t") as (t_ret, t_str):
        fill(s_ret, s_str, {"$sys/a": b"1"}, {"m": [("$sys/a", 3, b"2")]})
        p = p_of("$sys/a")
        state = collect(s_ret, s_str, p)
        assert [m.topic for m in state.retained] == ["$sys/a"]
        assert [m.topic for _, ms in state.streams for m in ms] == ["$sys/a"]
        partition_state.install(t_ret, t_str, state, belongs(p), NEW_DB)
        assert collect(t_ret, t_str, p).streams == state.streams


def _unit(tmp_path: Path) -> tuple[dict, int]:  # type: ignore[type-arg]
    """A valid unit of the partition of `t/1`."""
    with stores(tmp_path / "u") as (ret, strm):
        fill(ret, strm, {"t/1": b"a", "t/2": b"b"}, {"m": [("t/1", 1, b"x"), ("t/2", 2, b"y")]})
        p = p_of("t/1")
        return partition_state.to_json(collect(ret, strm, p)), p


def _foreign(p: int) -> str:
    return next(t for t in (f"other/{i}" for i in range(100)) if p_of(t) != p)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda u: {**u, "digest": "0" * 64}, "digest"),
        (lambda u: {**u, "format": 2}, "format"),
        (lambda u: {**u, "mark": "nocolon"}, "mark"),
        (lambda u: {**u, "partition": 9}, "partition"),
        (lambda u: {**u, "retained": [[u["foreign"], "YQ", 0, 1, None]]}, "not of this partition"),
        (lambda u: {**u, "retained": [["t/1", "", 0, 1, None]]}, "empty"),
        (lambda u: {**u, "retained": [["t/1", "YQ", 3, 1, None]]}, "qos"),
        (lambda u: {**u, "retained": [["t/1", "!!", 0, 1, None]]}, "base64url"),
        (lambda u: {**u, "retained": [["t/1", "YQ", 0, 1]]}, r"must be \[topic"),
        (lambda u: {**u, "streams": {"m": []}}, "non-empty"),
        (lambda u: {**u, "streams": {"bad name!": [["t/1", 1, "YQ"]]}}, "database"),
        (lambda u: {**u, "streams": {"m": [["t/1", -1, "YQ"]]}}, "ts"),
        (lambda u: {**u, "streams": []}, "streams"),
        (lambda u: [u], "object"),
    ],
)
def test_a_malformed_unit_is_refused(
    tmp_path: Path,
    change: Callable[[dict[str, Any]], Any],
    says: str,
) -> None:
    unit, p = _unit(tmp_path)
    bad = change({**unit, "foreign": _foreign(p)})
    with pytest.raises(ValueError, match=says):
        partition_state.from_json(bad, belongs(p))


def test_unsorted_retained_topics_are_refused(tmp_path: Path) -> None:
    unit, p = _unit(tmp_path)
    same = [t for t in (f"x/{i}" for i in range(200)) if p_of(t) == p][:2]
    rows = [[t, "YQ", 0, 1, None] for t in reversed(sorted(same))]
    with pytest.raises(ValueError, match="topic order"):
        partition_state.from_json({**unit, "retained": rows}, belongs(p))


# -- any source over any target ------------------------------------------------------------

_topic = st.sampled_from(TOPICS)
_payload = st.binary(min_size=1, max_size=4)
_kept = st.dictionaries(_topic, _payload, max_size=8)
_messages = st.dictionaries(
    st.sampled_from(["m", "n"]),
    st.lists(st.tuples(_topic, st.integers(0, 3), _payload), max_size=10),
    max_size=2,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=st.tuples(_kept, _messages),
    target=st.tuples(_kept, _messages),
    p=st.integers(0, PARTITIONS - 1),
)
def test_installing_any_state_over_any_target_gives_its_digest(
    source: tuple[dict, dict],  # type: ignore[type-arg]
    target: tuple[dict, dict],  # type: ignore[type-arg]
    p: int,
) -> None:
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        with stores(base / "s") as (s_ret, s_str), stores(base / "t") as (t_ret, t_str):
            fill(s_ret, s_str, *source)
            fill(t_ret, t_str, *target)
            state = collect(s_ret, s_str, p)
            others = [collect(t_ret, t_str, q) for q in range(PARTITIONS) if q != p]
            partition_state.install(t_ret, t_str, state, belongs(p), NEW_DB)
            got = collect(t_ret, t_str, p)
            assert (got.retained, got.streams) == (state.retained, state.streams)
            assert [collect(t_ret, t_str, q) for q in range(PARTITIONS) if q != p] == others
