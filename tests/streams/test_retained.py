"""The retained-message store (relay_streams.retained): MQTT matching against a naive matcher,
keyset paging under concurrent writes, size, expiry, limits, restarts and refused input."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_streams.errors import BadInput, Closed
from relay_streams.retained import (
    Retained,
    RetainedFull,
    RetainedSettings,
    RetainedStore,
    Write,
)
from relay_topics import rules
from relay_topics.pages import order_key
from tests.helpers import kill_when_acked

NOW = 1_700_000_000_000


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RetainedStore]:
    s = RetainedStore(tmp_path / "retained")
    yield s
    s.close()


def naive(stored: dict[str, bytes], topic_filter: str) -> list[str]:
    """Every stored topic the filter matches, in the store's topic order (level by level)."""
    found = [t for t in stored if rules.topic_matches(topic_filter, t)]
    return sorted(found, key=lambda t: [level.encode() for level in t.split("/")])


def topics_of(messages: Iterator[Retained] | list[Retained]) -> list[str]:
    return [m.topic for m in messages]


# Small alphabets so that random filters hit random topics often; `$` first levels, empty levels,
# prefixes of each other ("a", "ab"), and a byte above `/` and below letters ("!").
LEVEL = st.sampled_from(["", "a", "ab", "b", "!", "$SYS", "$x", "é", "a\x01"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=7).map("/".join).filter(bool)
FILTER_LEVEL = st.sampled_from(["", "a", "ab", "b", "$SYS", "+", "+", "+"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(FILTER_LEVEL, min_size=1, max_size=6))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "+"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    stored=st.lists(TOPIC, min_size=0, max_size=60, unique=True),
    queries=st.lists(filters(), min_size=1, max_size=12),
)
def test_match_is_naive_matching_in_topic_order(
    tmp_path_factory: pytest.TempPathFactory, stored: list[str], queries: list[str]
) -> None:
    path = tmp_path_factory.mktemp("match")
    with RetainedStore(path / "r") as s:
        expected = {}
        for i, topic in enumerate(stored):
            s.store(topic, f"p{i}".encode(), now=NOW)
            expected[topic] = f"p{i}".encode()
        for query in [*queries, "#", "+", "+/#", "$SYS/#"]:
            got = list(s.match(query, now=NOW))
            assert topics_of(got) == naive(expected, query), query
            assert all(m.payload == expected[m.topic] for m in got)
            # Resuming after any returned topic gives the rest.
            names = topics_of(got)
            for k in range(len(names)):
                assert topics_of(s.match(query, after=names[k], now=NOW)) == names[k + 1 :]


def test_dollar_topics_need_a_literal_first_level(store: RetainedStore) -> None:
    for topic in ["$SYS/broker/load", "$share", "a/b", "/a"]:
        store.store(topic, b"x")
    assert topics_of(store.match("#")) == ["/a", "a/b"]
    assert topics_of(store.match("+/broker/+")) == []
    assert topics_of(store.match("$SYS/#")) == ["$SYS/broker/load"]
    assert topics_of(store.match("$share")) == ["$share"]
    assert topics_of(store.match("a/#")) == ["a/b"]
    assert topics_of(store.match("+/+")) == ["/a", "a/b"]


def test_match_is_lazy(store: RetainedStore) -> None:
    for i in range(50):
        store.store(f"d/{i:03}", b"x")
    it = store.match("d/+")
    assert next(it).topic == "d/000"
    store.store("d/999", b"late")  # written while the scan runs: not seen (snapshot)
    store.delete("d/010")  # nor is this delete
    assert topics_of(it) == [f"d/{i:03}" for i in range(1, 50)]
    assert topics_of(store.match("d/+"))[-1] == "d/999"


def test_store_read_replace_delete_and_size(store: RetainedStore) -> None:
    assert store.size() == 0
    assert store.store("a/b", b"1", qos=1, now=NOW)
    assert store.read("a/b") == Retained("a/b", b"1", 1, NOW, None)
    store.store("a/b", b"2", now=NOW + 1)
    assert store.size() == 1
    assert store.read("a/b") == Retained("a/b", b"2", 0, NOW + 1, None)
    assert not store.store("a/b", b"")  # empty payload: a delete
    assert store.read("a/b") is None
    assert store.size() == 0
    assert not store.delete("a/b")
    assert not store.store("a/b", b"")  # deleting what is not there: nothing retained
    assert store.size() == 0
    store.store("x", b"1")
    store.store("y", b"1")
    assert store.delete("x")
    assert store.size() == 1
    store.clean()
    assert store.size() == 0
    assert list(store.match("#")) == []
    store.store("z", b"1")
    assert store.size() == 1


def test_paging_visits_each_message_once_while_writes_happen(store: RetainedStore) -> None:
    live = {f"t/{i:04}/{i % 7}": b"v" for i in range(0, 1000, 2)}
    for topic, payload in live.items():
        store.store(topic, payload)
    before = set(live)
    seen: list[str] = []
    cursor: str | None = None
    step = 0
    while True:
        page, cursor = store.page("#", after=cursor, limit=37)
        seen += topics_of(page)
        if cursor is None:
            break
        # Between pages: new topics on both sides of the cursor, updates, deletes.
        step += 1
        store.store(f"t/{(step * 13) % 1000:04}/new", b"n")
        store.store(seen[0], b"updated")
        victim = f"t/{(step * 29) % 1000:04}/{(step * 29) % 1000 % 7}"
        if victim in live and victim not in seen:
            store.delete(victim)
            before.discard(victim)
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen, key=lambda t: [x.encode() for x in t.split("/")])
    assert before <= set(seen)  # everything retained throughout was visited


def test_page_n_starts_where_page_n_minus_1_ended(store: RetainedStore) -> None:
    for i in range(10):
        store.store(f"s/{i}", b"x")
    first, cursor = store.page("s/+", limit=4)
    assert topics_of(first) == ["s/0", "s/1", "s/2", "s/3"]
    assert cursor == "s/3"
    second, cursor = store.page("s/+", after=cursor, limit=4)
    assert topics_of(second) == ["s/4", "s/5", "s/6", "s/7"]
    third, cursor = store.page("s/+", after=cursor, limit=4)
    assert topics_of(third) == ["s/8", "s/9"]
    assert cursor is None
    # A cursor topic that was deleted in between still works.
    store.delete("s/3")
    again, _ = store.page("s/+", after="s/3", limit=2)
    assert topics_of(again) == ["s/4", "s/5"]


def test_restart_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "r"
    with RetainedStore(path) as s:
        for i in range(200):
            s.store(f"r/{i}", str(i).encode(), expiry_interval_s=10 if i % 2 else None, now=NOW)
        s.delete("r/0")
        before = list(s.match("#", now=NOW))
    with RetainedStore(path) as s:
        assert s.size() == 199
        assert list(s.match("#", now=NOW)) == before
        assert s.clear_expired(now=NOW + 10_000) == 100
        assert s.size() == 99


def test_expiry_removes_what_is_due_and_nothing_else(store: RetainedStore) -> None:
    store.store("e/never", b"x", now=NOW)
    store.store("e/10", b"x", expiry_interval_s=10, now=NOW)
    store.store("e/20", b"x", expiry_interval_s=20, now=NOW)
    store.store("e/replaced", b"x", expiry_interval_s=5, now=NOW)
    store.store("e/replaced", b"y", expiry_interval_s=100, now=NOW)  # old expiry entry gone
    store.store("e/cleared", b"x", expiry_interval_s=5, now=NOW)
    store.store("e/cleared", b"y", now=NOW)  # now never expires
    assert store.read("e/10", now=NOW + 9_999) is not None
    assert store.read("e/10", now=NOW + 10_000) is None  # expired is never returned
    assert topics_of(store.match("e/+", now=NOW + 10_000)) == [
        "e/20",
        "e/cleared",
        "e/never",
        "e/replaced",
    ]
    assert store.size() == 5  # counted until cleared
    assert store.clear_expired(now=NOW + 9_999) == 0
    assert store.clear_expired(now=NOW + 10_000, batch_size=1) == 1
    assert store.size() == 4
    assert store.clear_expired(now=NOW + 99_000) == 1
    assert topics_of(store.match("#", now=NOW)) == ["e/cleared", "e/never", "e/replaced"]
    assert store.clear_expired(now=NOW + 10**9) == 1
    assert topics_of(store.match("#", now=NOW)) == ["e/cleared", "e/never"]
    assert store.size() == 2


def test_max_retained_refuses_new_topics_but_updates_old(tmp_path: Path) -> None:
    with RetainedStore(tmp_path / "r", RetainedSettings(max_retained=2)) as s:
        s.store("a", b"1")
        s.store("b", b"1")
        with pytest.raises(RetainedFull):
            s.store("c", b"1")
        assert s.store("a", b"2")
        updated = s.read("a")
        assert updated is not None
        assert updated.payload == b"2"
        s.delete("b")
        s.store("c", b"1")
        assert topics_of(s.match("#")) == ["a", "c"]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.store("a/+", b"x"), rules.TopicError),
        (lambda s: s.store("", b"x"), rules.TopicError),
        (lambda s: s.store("a\x00b", b"x"), rules.TopicError),
        (lambda s: s.store("a", "text"), BadInput),
        (lambda s: s.store("a", b"x" * ((1 << 20) + 1)), BadInput),
        (lambda s: s.store("a", b"x", qos=3), BadInput),
        (lambda s: s.store("a", b"x", expiry_interval_s=0), BadInput),
        (lambda s: s.store("a", b"x", expiry_interval_s=1 << 32), BadInput),
        (lambda s: s.store_many([Write("a", b"x", expires_at=0)]), BadInput),
        (lambda s: s.store_many([Write("a", b"x", expires_at=1 << 63)]), BadInput),
        (lambda s: s.delete("a/#"), rules.TopicError),
        (lambda s: s.match("a/#/b"), rules.TopicError),
        (lambda s: s.match("#", after="a/+"), rules.TopicError),
        (lambda s: s.page("#", limit=0), BadInput),
        (lambda s: s.read("+"), rules.TopicError),
    ],
)
def test_bad_input_changes_nothing(store: RetainedStore, call: object, error: type) -> None:
    store.store("a", b"keep", expiry_interval_s=60, now=NOW)
    before = (list(store.match("#", now=NOW)), store.size())
    with pytest.raises(error):
        call(store)  # type: ignore[operator]
    assert (list(store.match("#", now=NOW)), store.size()) == before
    assert store.clear_expired(now=NOW + 60_000) == 1


def test_settings_and_close(tmp_path: Path) -> None:
    with pytest.raises(BadInput):
        RetainedSettings(max_payload_bytes=-1)
    s = RetainedStore(tmp_path / "r", RetainedSettings(max_payload_bytes=3))
    with pytest.raises(BadInput):
        s.store("a", b"four")
    s.store("a", b"abc")
    s.store("b", b"abc")
    running = s.match("#")
    assert next(running).topic == "a"
    s.close()
    with pytest.raises(Closed):
        next(running)
    s.close()  # idempotent
    with pytest.raises(Closed):
        s.store("a", b"x")
    with pytest.raises(Closed):
        s.size()
    assert os.path.isdir(tmp_path / "r")


def test_check_finds_a_consistent_store(store: RetainedStore) -> None:
    for i in range(20):
        store.store(f"c/{i}", b"x", expiry_interval_s=5 if i % 3 else None)
    store.delete("c/4")
    assert store.check() == []


def test_store_many_is_one_batch_in_order(store: RetainedStore) -> None:
    store.store("m/old", b"x", expiry_interval_s=5, now=NOW)
    results = store.store_many(
        [
            Write("m/a", b"1"),
            Write("m/a", b"2", qos=2, expiry_interval_s=10),  # the later write wins
            Write("m/old", b"y"),  # replaces, and drops the old expiry entry
            Write("m/b", b"1"),
            Write("m/b", b""),  # then deleted
            Write("m/none", b""),
        ],
        now=NOW,
    )
    assert results == [True, True, True, True, False, False]
    assert store.read("m/a", now=NOW) == Retained("m/a", b"2", 2, NOW, NOW + 10_000)
    assert topics_of(store.match("m/#", now=NOW)) == ["m/a", "m/old"]
    assert store.size() == 2
    assert store.check() == []
    assert store.clear_expired(now=NOW + 10**9) == 1
    assert store.check() == []


def test_a_write_may_carry_its_own_ts(store: RetainedStore) -> None:
    store.store_many([Write("t/a", b"1", expiry_interval_s=10, ts=NOW - 5_000)], now=NOW)
    assert store.read("t/a", now=NOW) == Retained("t/a", b"1", 0, NOW - 5_000, NOW + 5_000)
    assert store.clear_expired(now=NOW + 5_000) == 1  # expiry counts from the write's ts
    with pytest.raises(BadInput):
        store.store_many([Write("t/b", b"1", ts=-1)])
    assert store.size() == 0


@given(st.lists(TOPIC, min_size=1, max_size=30, unique=True))
@settings(max_examples=40, deadline=None)
def test_order_key_is_the_stores_order(stored: list[str]) -> None:
    """The store's scan order is `relay_topics.pages.order_key` (its keys are built on it), so
    answers of several stores merged by it come in the order one store gives."""
    with tempfile.TemporaryDirectory() as tmp, RetainedStore(Path(tmp) / "r") as one:
        one.store_many([Write(t, b"x") for t in stored])
        plain = sorted((t for t in stored if not t.startswith("$")), key=order_key)
        assert topics_of(one.match("#")) == plain


def test_store_many_is_all_or_nothing(tmp_path: Path) -> None:
    with RetainedStore(tmp_path / "r", RetainedSettings(max_retained=3)) as s:
        s.store("a", b"1")
        with pytest.raises(RetainedFull):
            s.store_many([Write("a", b"2"), Write("b", b"1"), Write("c", b"1"), Write("d", b"1")])
        with pytest.raises(rules.TopicError):
            s.store_many([Write("b", b"1"), Write("#", b"1")])
        assert [(m.topic, m.payload) for m in s.match("#")] == [("a", b"1")]
        assert s.size() == 1
        # Deleting first makes room within the same call.
        assert s.store_many([Write("a", b""), Write("b", b"1"), Write("c", b"1"), Write("d", b"1")])
        assert topics_of(s.match("#")) == ["b", "c", "d"]
        assert s.check() == []


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    # A process kill leaves the page cache alone, so tmpfs (fsync for free) tests the same thing.
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="retained-crash-", dir=shm)) if shm.is_dir() else tmp_path
    try:
        for round_ in range(3):
            acked = kill_when_acked(
                "tests.streams.retained_crash_child", str(root), count=300 * (round_ + 1)
            )
            assert acked >= 300 * (round_ + 1)  # the child was writing, not failing
            with RetainedStore(root / "retained") as s:
                assert s.check() == []
                kept = {m.topic for m in s.match("k/+", now=0)}
                # Each round starts over at 1 (same topics); nothing acknowledged is lost.
                assert {f"k/{i}" for i in range(1, acked + 1)} <= kept
                assert s.size() == len(list(s.match("#", now=0)))
    finally:
        if root.is_relative_to(shm):
            shutil.rmtree(root, ignore_errors=True)


def test_a_write_with_expires_at_keeps_it_exactly(store: RetainedStore) -> None:
    store.store_many([Write("a", b"x", 1, 60, NOW, expires_at=NOW + 1234)])
    (found,) = store.every()
    assert (found.ts, found.expires_at) == (NOW, NOW + 1234)
    assert store.clear_expired(now=NOW + 1234) == 1
