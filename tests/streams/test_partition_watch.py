"""A retainer partition's watch (`relay_streams.partition_watch`) over real RocksDB stores: it
follows every write, settles a copy taken while writes went on, and its changes installed over
the copy give the source's state on another retainer."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay_streams import partition_state as ps
from relay_streams import partition_watch as pw
from relay_streams.model import Message
from relay_streams.retained import RetainedStore, Write
from relay_streams.store import StreamStore
from tests.streams.test_partition_state import (
    EPOCH,
    NEW_DB,
    PARTITIONS,
    TOPICS,
    belongs,
    collect,
    fill,
    p_of,
    stores,
)

Op = tuple[str, Any]


def apply(
    retained: RetainedStore, streams: StreamStore, watches: pw.Watches, op: Op, now: int
) -> None:
    """One write to the source, told to its watches as the retainer's writers tell them."""
    kind, arg = op
    if kind == "put":
        topic, payload, expiry = arg
        retained.store_many([Write(topic, payload, 0, expiry, now)])
        watches.touched([topic])
    elif kind == "delete":
        retained.store_many([Write(arg, b"")])
        watches.touched([arg])
    elif kind == "expire":
        removed: list[str] = []
        retained.clear_expired(now=now + arg, topics=removed)
        watches.touched(removed)
    else:  # append: explicit ts, or the store's clock
        db, topic, payload, ts = arg
        if db not in streams.storages():
            streams.open_db(db, NEW_DB)
        message: Message | tuple[str, bytes] = (
            (topic, payload) if ts is None else Message(topic, payload, ts)
        )
        watches.appended(db, streams.store_batch(db, [message]))


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.tuples(
                st.sampled_from(TOPICS),
                st.binary(min_size=1, max_size=3),
                st.sampled_from([None, 1, 5]),
            ),
        ),
        st.tuples(st.just("delete"), st.sampled_from(TOPICS)),
        st.tuples(st.just("expire"), st.sampled_from([0, 2_000, 10_000])),
        st.tuples(
            st.just("append"),
            st.tuples(
                st.sampled_from(["m", "n"]),
                st.sampled_from(TOPICS),
                st.binary(min_size=1, max_size=3),
                st.one_of(st.none(), st.integers(0, 3_000_000)),
            ),
        ),
    ),
    max_size=25,
)
_seed = st.tuples(
    st.dictionaries(st.sampled_from(TOPICS), st.binary(min_size=1, max_size=3), max_size=6),
    st.dictionaries(
        st.sampled_from(["m"]),
        st.lists(
            st.tuples(
                st.sampled_from(TOPICS), st.integers(0, 3), st.binary(min_size=1, max_size=3)
            ),
            max_size=8,
        ),
        max_size=1,
    ),
)


def _watches() -> pw.Watches:
    return pw.Watches(PARTITIONS, p_of)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=_seed, before=_ops, during=_ops, after=_ops, p=st.integers(0, PARTITIONS - 1))
def test_changes_since_a_settled_copy_give_the_source_state_and_its_digest(
    seed: tuple[dict, dict],  # type: ignore[type-arg]
    before: list[Op],
    during: list[Op],
    after: list[Op],
    p: int,
) -> None:
    """Writes `before` the copy, `during` its collection (the watch started, the copy taken
    before them), and `after` it settled (half of them before the watch has its copy's
    digests): the watch's digest is a whole collection's, and its changes, carried as JSON
    and installed over the copy on a target, give the same state."""
    now = 1_000_000
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        with stores(base / "s") as (s_ret, s_str), stores(base / "t") as (t_ret, t_str):
            fill(s_ret, s_str, *seed)
            watches = _watches()
            for op in before:
                apply(s_ret, s_str, watches, op, now)
            watch = watches.start(p)
            copy = collect(s_ret, s_str, p)
            for op in during:
                apply(s_ret, s_str, watches, op, now)
            exact = watch.settle(copy, s_ret, s_str)
            assert ps.digest(exact) == ps.digest(collect(s_ret, s_str, p))
            ps.install(t_ret, t_str, exact, belongs(p), NEW_DB)
            target = pw.Watch(p, PARTITIONS, watch.token)
            target.rebase(collect(t_ret, t_str, p))
            half = len(after) // 2
            for op in after[:half]:  # told before the watch follows its copy's digests
                apply(s_ret, s_str, watches, op, now)
            watch.follow(ps.Digests.of(exact))
            for op in after[half:]:
                apply(s_ret, s_str, watches, op, now)
            source_now = ps.digest(collect(s_ret, s_str, p))
            assert watch.refresh(s_ret, s_str).whole(p, PARTITIONS) == source_now

            unit = json.loads(json.dumps(pw.to_json(watch.changes(s_ret, s_str, exact.mark))))
            changes = pw.from_json(unit, belongs(p))
            assert changes.digest == source_now
            pw.install(t_ret, t_str, changes, target, NEW_DB)
            assert target.refresh(t_ret, t_str).whole(p, PARTITIONS) == source_now
            got, want = collect(t_ret, t_str, p), collect(s_ret, s_str, p)
            assert (got.retained, got.streams) == (want.retained, want.streams)


def test_a_watch_past_its_bytes_is_stale_and_gives_no_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pw, "MAX_APPENDED_BYTES", 10)
    topic = TOPICS[0]
    p = p_of(topic)
    with stores(tmp_path) as (ret, strm):
        watches = _watches()
        watch = watches.start(p)
        watch.rebase(collect(ret, strm, p))
        apply(ret, strm, watches, ("append", ("m", topic, b"x" * 6, None)), 0)
        assert watch.ready
        apply(ret, strm, watches, ("append", ("m", topic, b"x" * 6, None)), 0)
        assert not watch.ready
        assert watch.appended == []
        with pytest.raises(ValueError, match="stale"):
            watch.changes(ret, strm, "")


def test_a_watch_not_settled_has_no_digest(tmp_path: Path) -> None:
    with stores(tmp_path) as (ret, strm):
        watch = _watches().start(1)
        assert not watch.ready
        with pytest.raises(ValueError, match="settled"):
            watch.refresh(ret, strm)


def _changes(p: int) -> dict[str, Any]:
    topic = next(t for t in TOPICS if p_of(t) == p)
    return pw.to_json(
        pw.Changes(
            p,
            PARTITIONS,
            "tok",
            f"{EPOCH}:3",
            "d" * 64,
            (),
            (topic,),
            (("m", Message(topic, b"x", 5)),),
        )
    )


def _other(p: int) -> str:
    return next(t for t in (f"other/{i}" for i in range(100)) if p_of(t) != p)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda u, o: {**u, "changes": False}, "changes: true"),
        (lambda u, o: {**u, "since": ""}, "since"),
        (lambda u, o: {**u, "deleted": [o]}, "not of this partition"),
        (lambda u, o: {**u, "deleted": "x"}, "deleted"),
        (lambda u, o: {**u, "appended": [["m", o, 1, "YQ"]]}, "not of this partition"),
        (lambda u, o: {**u, "appended": [["m", u["deleted"][0], 1]]}, "must be"),
        (lambda u, o: {**u, "appended": [["bad db!", u["deleted"][0], 1, "YQ"]]}, "database"),
        (
            lambda u, o: {**u, "retained": [[u["deleted"][0], "YQ", 0, 1, None]]},
            "both written and deleted",
        ),
        (lambda u, o: {**u, "format": 9}, "format"),
    ],
)
def test_malformed_changes_are_refused(
    change: Callable[[dict[str, Any], str], Any], says: str
) -> None:
    p = 1
    unit = _changes(p)
    assert pw.from_json(unit, belongs(p)).deleted == tuple(unit["deleted"])
    with pytest.raises(ValueError, match=says):
        pw.from_json(change(unit, _other(p)), belongs(p))
