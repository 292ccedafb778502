"""The stream store through its public calls: databases, generations, iterators, layouts,
bad input, damaged records, egress batching, sites and replica records."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from relay_ds.info import Replica, SiteShard, Transition, render_info
from relay_ds.tokens import Stream, StreamIterator
from relay_streams.errors import (
    BadInput,
    BadToken,
    Closed,
    CorruptRecord,
    NotFound,
    UnknownLayout,
)
from relay_streams.layouts import base
from relay_streams.model import Message
from relay_streams.settings import DbSettings
from relay_streams.shard import shard_of
from relay_streams.store import StreamStore
from tests.streams.conftest import raw_shard, replay, replay_stream


def msgs(topic: str, count: int, ts0: int = 1_000) -> list[Message]:
    return [Message(topic, b"%s-%d" % (topic.encode(), i), ts0 + i) for i in range(count)]


def reopen(store: StreamStore) -> StreamStore:
    store.close()
    return StreamStore(store.root, node="test-node")


# -- replay and iterators ----------------------------------------------------------------------


def test_next_with_max_bytes_stops_early_and_resumes_exactly(store: StreamStore) -> None:
    """`max_bytes` bounds an answer (the retainer's reply must fit a Kafka record); the
    iterator continues right after the last message returned, also past skipped topics."""
    db = store.open_db("m", DbSettings(shards=1, layout="reference/1"))
    batch = [Message("a/x" if i % 3 else "a/y", b"p" * 100, 1_000 + i) for i in range(30)]
    db.store_batch(batch)
    db.add_generation()
    ranked = db.get_streams("a/x")[0]  # generation 1, closed: its end is reached
    iterator = db.make_iterator(ranked.stream, "a/x")
    got: list[Message] = []
    while True:
        result = db.next(iterator, 1_000, max_bytes=350)
        assert 1 <= len(result.messages) <= 4 or result.end_of_stream
        got += result.messages
        iterator = result.iterator
        if result.end_of_stream:
            break
    assert got == [m for m in batch if m.topic == "a/x"]
    one = db.next(db.make_iterator(ranked.stream, "a/x"), 10, max_bytes=1)
    assert len(one.messages) == 1
    assert not one.end_of_stream
    with pytest.raises(BadInput, match="max_bytes"):
        db.next(iterator, 1, max_bytes=0)


def test_replay_returns_matching_messages_in_time_order(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=3))
    batch = [Message(f"dev/{i % 7}/temp", b"%d" % i, 5_000 - i) for i in range(200)]
    db.store_batch(batch)
    got = replay(db, "dev/3/temp")
    assert sorted(got) == sorted(m for m in batch if m.topic == "dev/3/temp")
    assert [m.ts for m in got] == sorted(m.ts for m in got)
    assert sorted(replay(db, "#")) == sorted(batch)
    assert [m.ts for m in replay(db, "dev/3/temp", start=4_900)] == sorted(
        m.ts for m in batch if m.topic == "dev/3/temp" and m.ts >= 4_900
    )


@pytest.mark.parametrize("layout", ["lts/1", "reference/1"])
def test_every_message_includes_dollar_topics_that_hash_does_not_match(
    store: StreamStore, layout: str
) -> None:
    db = store.open_db("m", DbSettings(shards=2, layout=layout))
    batch = [
        Message(topic, b"%d" % i, 1_000 + i)
        for i, topic in enumerate(["a/b", "$SYS/x", "$share/q/r", "c", "$x"] * 7)
    ]
    db.store_batch(batch)
    db.add_generation()  # a closed generation's messages count too
    later = msgs("$SYS/late", 3, 9_000) + msgs("d/e", 2, 9_000)
    db.store_batch(later)
    assert sorted(replay(db, "#")) == sorted(m for m in batch + later if m.topic[0] != "$")
    pages = list(store.every_message("m", page=4))
    assert all(0 < len(page) <= 4 for page in pages)
    assert sorted(m for page in pages for m in page) == sorted(batch + later)


def test_iterators_and_streams_resume_after_a_restart(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=2))
    db.store_batch(msgs("a/b", 100))
    (ranked,) = db.get_streams("a/b")
    first = db.next(db.make_iterator(ranked.stream.token(), "a/b"), 30)
    assert [m.ts for m in first.messages] == list(range(1_000, 1_030))
    saved_iterator, saved_stream = first.iterator.token(), ranked.stream.token()
    store = reopen(store)
    db = store.open_db("m")
    assert [r.stream.token() for r in db.get_streams("a/b")] == [saved_stream]
    rest = db.next(saved_iterator, 1_000)
    assert [m.ts for m in rest.messages] == list(range(1_030, 1_100))
    assert not rest.end_of_stream  # the current generation can still grow
    db.store_batch(msgs("a/b", 1, ts0=2_000))
    assert [m.ts for m in db.next(rest.iterator, 10).messages] == [2_000]
    # A stream string also makes a fresh iterator after the restart.
    assert len(replay_stream(db, Stream.from_token(saved_stream), "a/b")) == 101
    store.close()


def test_ranks_are_shard_and_generation(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=4))
    topics_ = [f"t/{i}" for i in range(12)]
    db.store_batch([Message(t, b"x", 1) for t in topics_])
    db.add_generation()
    db.store_batch([Message(t, b"y", 2) for t in topics_])
    ranked = db.get_streams("t/+")
    assert {r.rank[1] for r in ranked} == {1, 2}
    for r in ranked:
        assert r.rank == (r.stream.shard, r.stream.generation)
        for m in replay_stream(db, r.stream, "t/+"):
            assert shard_of(m.topic, 4) == r.rank[0]
            assert m.payload == (b"x" if r.rank[1] == 1 else b"y")


def test_a_closed_generation_ends_its_streams_and_the_current_one_does_not(
    store: StreamStore,
) -> None:
    db = store.open_db("m", DbSettings(shards=1))
    db.store_batch(msgs("a", 5))
    (ranked,) = db.get_streams("a")
    iterator = db.make_iterator(ranked.stream, "a")
    result = db.next(iterator, 100)
    assert len(result.messages) == 5
    assert not result.end_of_stream
    db.add_generation()
    result = db.next(result.iterator, 100)
    assert result.messages == []
    assert result.end_of_stream
    # A new stream appears once its topic is learned in the new generation.
    assert [r.rank[1] for r in db.get_streams("a")] == [1]
    db.store_batch(msgs("a", 1, ts0=3_000))
    # Closed generations whose messages are all older than `start` are skipped.
    assert [r.rank[1] for r in db.get_streams("a", start=0)] == [1, 2]
    assert [r.rank[1] for r in db.get_streams("a", start=1_005)] == [2]


def test_dropping_a_generation_removes_its_data_and_ends_its_iterators(
    store: StreamStore,
) -> None:
    db = store.open_db("m", DbSettings(shards=2))
    db.store_batch(msgs("a/1", 3_000))
    old = db.get_streams("a/1")[0].stream
    iterator = db.next(db.make_iterator(old, "a/1"), 10).iterator.token()
    db.add_generation()
    db.store_batch(msgs("a/1", 2, ts0=9_000))
    with pytest.raises(BadInput, match="current"):
        db.drop_generation(2)
    with pytest.raises(NotFound):
        db.drop_generation(7)
    before = db.disk_bytes(flush=True)
    db.drop_generation(1)
    assert db.disk_bytes(flush=True) < before
    ended = db.next(iterator, 10)
    assert ended.messages == []
    assert ended.end_of_stream
    with pytest.raises(NotFound, match="generation 1"):
        db.make_iterator(old, "a/1")
    assert [m.ts for m in replay(db, "a/1")] == [9_000, 9_001]
    assert [g.number for g in db.generations()] == [2]
    assert db.check() == []
    store = reopen(store)
    db = store.open_db("m")
    assert db.next(iterator, 10).end_of_stream
    assert db.check() == []
    store.close()


def test_retention_drops_closed_generations_by_age(tmp_path: Path) -> None:
    now = [1_000]
    store = StreamStore(tmp_path, clock=lambda: now[0])
    db = store.open_db("m")
    for step in range(3):
        db.store_batch([("x", b"%d" % step)])
        now[0] += 1_000
        db.add_generation()
    assert [(g.since, g.until) for g in db.generations()] == [
        (1_000, 2_000),
        (2_000, 3_000),
        (3_000, 4_000),
        (4_000, None),
    ]
    assert db.drop_generations_before(3_000) == [1, 2]
    assert [m.payload for m in replay(db, "x")] == [b"2"]
    store.close()


def test_new_generations_inherit_the_learned_structure(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=1, lts_thresholds=(10, 2)))
    db.store_batch([Message(f"dev/{i}", b"", 1) for i in range(10)])
    assert db.generations()[0].streams == 3  # dev/0, dev/1, dev/+
    db.add_generation()
    assert db.generations()[1].streams == 1  # dev/+ only: concrete topics are not inherited
    db.store_batch([Message("dev/0", b"", 2)])
    assert db.generations()[1].streams == 1
    # The learned structure survives a restart.
    store = reopen(store)
    db = store.open_db("m")
    assert [g.streams for g in db.generations()] == [3, 1]
    store.close()


# -- layouts -------------------------------------------------------------------------------


def test_data_of_an_old_layout_stays_readable_after_a_layout_change(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=2, layout="reference/1"))
    old = msgs("a/b", 10) + msgs("$SYS/x", 2)
    db.store_batch(old)
    assert len(db.get_streams("a/b")) == 2  # one stream per shard
    store.close_db("m")
    db = store.open_db("m", DbSettings(shards=2, layout="lts/1"))
    db.add_generation()
    new = msgs("a/b", 10, ts0=5_000)
    db.store_batch(new)
    assert [g.layout for g in db.generations()] == ["reference/1", "lts/1"]
    assert replay(db, "a/#") == old[:10] + new
    assert replay(db, "#") == old[:10] + new  # '#' skips $-topics in both layouts
    assert replay(db, "$SYS/#") == old[10:]
    assert db.check() == []


def test_an_unknown_layout_version_is_a_clear_error(store: StreamStore) -> None:
    with pytest.raises(BadInput, match="unknown layout 'lts/9'"):
        DbSettings(layout="lts/9")
    db = store.open_db("m")
    db.store_batch(msgs("a", 3))
    path = db.path / "db.json"
    store.close_db("m")
    record = json.loads(path.read_text())
    record["generations"][0]["layout"] = "lts/9"
    path.write_text(json.dumps(record))
    with pytest.raises(UnknownLayout, match=r"database 'm' generation 1 uses layout 'lts/9'"):
        store.open_db("m")
    # The same when only the generation's own meta record names it (db.json says lts/1).
    record["generations"][0]["layout"] = "lts/1"
    path.write_text(json.dumps(record))
    with raw_shard(db.path) as rdict:
        meta = {"generation": 1, "layout": "lts/9", "options": {"thresholds": [100, 20]}}
        rdict.get_column_family("gen-1")[b"\x00meta"] = json.dumps(meta).encode()
    with pytest.raises(UnknownLayout, match="shard 0 generation 1 uses layout 'lts/9'"):
        store.open_db("m")


def test_a_corrupt_record_is_a_clear_error(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=1))
    db.store_batch(msgs("a/b", 3))
    (ranked,) = db.get_streams("a/b")
    store.close_db("m")
    with raw_shard(db.path) as rdict:
        cf = rdict.get_column_family("gen-1")
        keys = list(cf.keys(from_key=base.MESSAGES))
        cf[keys[1]] = b"\x07garbage"
        del cf
    db = store.open_db("m")
    iterator = db.make_iterator(ranked.stream, "a/b")
    with pytest.raises(CorruptRecord, match=r"database 'm' shard 0 generation 1 key .*format"):
        db.next(iterator, 10)
    problems = db.check()
    assert len(problems) == 1
    assert "format" in problems[0]
    store.close_db("m")
    (db.path / "db.json").write_text('{"v": 1, "name": "m"')
    with pytest.raises(CorruptRecord, match=re.escape("db.json: not a valid record")):
        store.open_db("m")
    (db.path / "db.json").write_text('{"v": 2}')
    with pytest.raises(CorruptRecord, match="record format 2, this code reads 1"):
        store.open_db("m")


def test_check_finds_records_that_disagree_with_the_stats(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=1))
    db.store_batch(msgs("a/b", 3))
    assert db.check() == []
    store.close_db("m")
    with raw_shard(db.path) as rdict:
        cf = rdict.get_column_family("gen-1")
        key = next(iter(cf.keys(from_key=base.MESSAGES)))
        del cf[key]
        del cf
    db = store.open_db("m")
    assert db.check() == ["database 'm' shard 0 generation 1: 2 messages, stats say 3"]


# -- bad input -----------------------------------------------------------------------------


def test_a_bad_message_refuses_the_whole_batch(store: StreamStore) -> None:
    db = store.open_db("m")
    good = Message("a", b"x", 1)
    for bad, why in [
        (Message("a/+", b"x", 1), "message 1: topic 'a/+' contains a wildcard"),
        (Message("", b"x", 1), "message 1: topic is empty"),
        (Message("a", "text", 1), "payload must be bytes"),  # type: ignore[arg-type]
        (Message("a", b"x", -1), "ts must be Unix ms"),
        (Message("a", b"x", True), "ts must be Unix ms"),  # type: ignore[arg-type]
        ("a", "not a Message"),
    ]:
        with pytest.raises(BadInput, match=re.escape(why)):
            db.store_batch([good, bad])  # type: ignore[list-item]
    assert replay(db, "#") == []
    assert db.generations()[0].messages == 0
    assert db.check() == []


def test_bad_filters_tokens_and_arguments_are_refused(store: StreamStore) -> None:
    db = store.open_db("m")
    other = store.open_db("other")
    db.store_batch(msgs("a", 2))
    other.store_batch(msgs("a", 2))
    (ranked,) = db.get_streams("a")
    iterator = db.make_iterator(ranked.stream, "a")
    with pytest.raises(BadInput, match="'#' must be the last level"):
        db.get_streams("#/a")
    with pytest.raises(BadInput, match="start"):
        db.get_streams("#", start=-5)
    with pytest.raises(BadInput, match="n must be"):
        db.next(iterator, 0)
    token = iterator.token()
    for bad, why in [
        ("", "non-empty"),
        ("!!!", "base64url"),
        (token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1], "checksum"),
        (ranked.stream.token(), "not a iterator"),
    ]:
        with pytest.raises(BadToken, match=why):
            db.next(bad, 1)
    with pytest.raises(BadToken, match="not a stream"):
        db.make_iterator(token, "a")
    with pytest.raises(BadToken, match="database 'other'"):
        db.next(other.make_iterator(other.get_streams("a")[0].stream, "a"), 1)
    with pytest.raises(BadToken, match="no shard"):
        db.make_iterator(Stream("m", 9, 1, 0), "a")  # type: ignore[arg-type]
    with pytest.raises(BadToken, match="no stream"):
        db.make_iterator(Stream("m", 0, 1, 10**6), "a")  # type: ignore[arg-type]
    forged = StreamIterator(ranked.stream, "a/#/b", 0, None).token()
    with pytest.raises(BadToken, match="filter"):
        db.next(forged, 1)
    with pytest.raises(BadInput, match="database name"):
        store.open_db("../x")
    assert replay(db, "a") == msgs("a", 2)


def test_settings_are_validated_persisted_and_shards_are_fixed(store: StreamStore) -> None:
    for bad in [
        {"shards": 0},
        {"egress_batch_size": 0},
        {"egress_flush_interval_ms": 0},
        {"lts_thresholds": ()},
        {"lts_thresholds": (5, 0)},
    ]:
        with pytest.raises(BadInput):
            DbSettings(**bad)  # type: ignore[arg-type]
    settings = DbSettings(shards=3, layout="reference/1", egress_batch_size=7)
    store.open_db("m", settings)
    store = reopen(store)
    db = store.open_db("m")
    assert db.settings == settings
    store.close_db("m")
    before = (db.path / "db.json").read_bytes()
    with pytest.raises(BadInput, match="3 shards; the shard count is fixed"):
        store.open_db("m", DbSettings(shards=2))
    assert (db.path / "db.json").read_bytes() == before
    db = store.open_db("m", DbSettings(shards=3, layout="lts/1"))
    with pytest.raises(BadInput, match="open with other settings"):
        store.open_db("m", DbSettings(shards=3, egress_batch_size=9))
    db.add_generation()
    assert [g.layout for g in db.generations()] == ["reference/1", "lts/1"]
    store.close()


# -- egress batching -----------------------------------------------------------------------


def test_buffered_messages_are_written_by_the_flush_interval(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(egress_flush_interval_ms=20, egress_batch_size=1_000))
    db.store_batch(msgs("a", 3), sync=False)
    deadline = time.monotonic() + 5
    while len(replay(db, "a")) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_full_buffer_is_written_before_the_interval(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(egress_flush_interval_ms=60_000, egress_batch_size=5))
    db.store_batch(msgs("a", 4), sync=False)
    time.sleep(0.1)
    assert replay(db, "a") == []  # neither full nor due
    db.store_batch(msgs("b", 1), sync=False)
    deadline = time.monotonic() + 5
    while len(replay(db, "#")) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_close_writes_buffered_messages(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(egress_flush_interval_ms=60_000))
    db.store_batch(msgs("a", 3), sync=False)
    store = reopen(store)
    assert replay(store.open_db("m"), "a") == msgs("a", 3)
    with pytest.raises(Closed):
        db.store_batch(msgs("a", 1))
    store.close()


def test_concurrent_synchronous_writers(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=2))

    def writer(k: int) -> None:
        for i in range(50):
            db.store_batch([Message(f"w/{k}", b"%d" % i, i)])

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(replay(db, "w/+")) == 400
    for k in range(8):
        assert [m.payload for m in replay(db, f"w/{k}")] == [b"%d" % i for i in range(50)]


def test_store_assigned_timestamps_never_go_back(tmp_path: Path) -> None:
    now = [5_000]
    store = StreamStore(tmp_path, clock=lambda: now[0])
    db = store.open_db("m")
    db.store_batch([("a", b"1")])
    now[0] = 4_000  # the clock steps back
    db.store_batch([("a", b"2")])
    assert [(m.payload, m.ts) for m in replay(db, "a")] == [(b"1", 5_000), (b"2", 5_000)]
    store.close()


def test_delete_by_filter_and_predicate(store: StreamStore) -> None:
    db = store.open_db("m", DbSettings(shards=2))
    db.store_batch(msgs("a/x", 10) + msgs("a/y", 10) + msgs("$SYS/a", 2))
    db.add_generation()
    db.store_batch(msgs("a/x", 10, ts0=5_000))
    assert db.delete("a/x", lambda m: m.ts % 2 == 0) == 10
    assert [m.ts % 2 for m in replay(db, "a/x")] == [1] * 10
    assert db.delete("#") == 20
    assert replay(db, "$SYS/#") == msgs("$SYS/a", 2)
    assert sum(g.messages for g in db.generations()) == 2
    assert db.check() == []


# -- databases, restarts and crashes in between ---------------------------------------------


def test_drop_db_removes_everything_and_a_leftover_is_cleaned_at_start(
    store: StreamStore,
) -> None:
    db = store.open_db("m")
    db.store_batch(msgs("a", 3))
    store.drop_db("m")
    assert not db.path.exists()
    assert store.list_dbs() == []
    with pytest.raises(NotFound):
        store.drop_db("m")
    assert replay(store.open_db("m"), "#") == []
    store.close_db("m")
    db.path.rename(db.path.with_name("m.dropping"))  # as if a drop crashed after its rename
    store = reopen(store)
    assert not db.path.with_name("m.dropping").exists()
    store.close()


def test_generation_changes_cut_short_by_a_crash_are_finished_on_open(
    store: StreamStore,
) -> None:
    db = store.open_db("m", DbSettings(shards=2))
    db.store_batch(msgs("a/b", 5))
    db.add_generation()
    path = db.path / "db.json"
    store.close_db("m")
    record = json.loads(path.read_text())
    # A drop of generation 1 that wrote db.json but crashed before dropping column families:
    dropped = {**record, "generations": record["generations"][1:]}
    path.write_text(json.dumps(dropped))
    db = store.open_db("m")
    assert [g.number for g in db.generations()] == [2]
    assert replay(db, "#") == []
    assert db.check() == []
    # An add of generation 3 that wrote db.json but crashed before creating column families:
    store.close_db("m")
    added = json.loads(path.read_text())
    added["generations"][-1]["until"] = 10**12
    added["generations"].append(
        {"number": 3, "layout": "lts/1", "options": {"thresholds": [100, 20]},
         "since": 10**12, "until": None}
    )  # fmt: skip
    path.write_text(json.dumps(added))
    db = store.open_db("m")
    assert [g.number for g in db.generations()] == [2, 3]
    db.store_batch(msgs("a/b", 1))
    assert db.check() == []


# -- sites and replica records ----------------------------------------------------------------


def test_the_site_id_is_random_and_persistent(tmp_path: Path) -> None:
    first = StreamStore(tmp_path / "one")
    site = first.this_site()
    assert len(site) == 16
    assert re.fullmatch(r"[0-9A-F]{16}", site), site
    assert site == site.upper()
    first.close()
    again = StreamStore(tmp_path / "one")
    assert again.this_site() == site
    other = StreamStore(tmp_path / "two")
    assert other.this_site() != site
    again.close()
    other.close()
    (tmp_path / "one" / "site.json").write_text("{}")
    with pytest.raises(CorruptRecord, match=re.escape("site.json")):
        StreamStore(tmp_path / "one")


def test_replica_sets_are_validated_and_recorded(store: StreamStore) -> None:
    here = store.this_site()
    store.open_db("m", DbSettings(shards=2))
    peer = store.register_site("00112233aabbccdd", "relay-retainer-1")
    assert peer == "00112233AABBCCDD"
    assert store.replicas("m") == [here]
    with pytest.raises(BadInput, match="unknown sites: FFFFFFFFFFFFFFFF"):
        store.set_replicas("m", [here, "FFFFFFFFFFFFFFFF"])
    with pytest.raises(BadInput, match="at least one site"):
        store.set_replicas("m", [])
    with pytest.raises(BadInput, match="16 hex digits"):
        store.set_replicas("m", ["xyz"])
    with pytest.raises(NotFound):
        store.set_replicas("nope", [here])
    store.join("m", peer)
    info = store.storage("m")
    assert [s.id for s in info.shards] == ["0", "1"]
    assert info.shards[0].replicas == [Replica(here, "up")]
    assert info.shards[0].transitions == [Transition(peer, "joining")]
    assert store.view().site(peer).shards[1] == SiteShard("m", "1", transition="joining")
    assert not store.view().site(peer).up
    described = store.description("retainer-3", [3, 7], lambda shard: 3 * 1024 + shard)
    assert (described.site, described.node, described.partitions) == (here, "retainer-3", [3, 7])
    assert [k.site for k in described.sites] == sorted([here, peer])
    (share,) = described.storages
    assert (share.name, share.replicas) == ("m", [here, peer])
    assert [s.id for s in share.shards] == ["3072", "3073"]  # as the retainer numbers them
    assert share.shards[1].transitions == [Transition(peer, "joining")]
    with pytest.raises(BadInput, match="in the replica set of 'm'"):
        store.forget_site(peer)
    with pytest.raises(BadInput, match="this site"):
        store.forget_site(here)
    text = render_info(store.info())
    assert text.startswith(f"THIS SITE:\n{here}\n\nSITES:\n")
    assert f"{peer}    'relay-retainer-1'" in text
    assert "down" in text
    assert f"m/1                               {here} +{peer}" in text
    # The record survives a restart, also for a database that is not open.
    store = reopen(store)
    assert store.replicas("m") == [here, peer]
    store.leave("m", peer)
    assert store.storage("m").shards[0].transitions == []
    store.forget_site(peer)
    with pytest.raises(NotFound):
        store.forget_site(peer)
    assert [s.site for s in store.view().summaries()] == [here]
    assert store.view().site(here).shards == [
        SiteShard("m", "0", "up"),
        SiteShard("m", "1", "up"),
    ]
    store.close()
