"""The pure replay and verify's classes on hand-made commands and replies: each queue rule,
duplicates applied once, unanswered commands uncertain only, order enforced."""

from __future__ import annotations

import pyarrow as pa
import pytest

from relay_archive import replay, standing, tables, verify
from relay_bus import schemas
from relay_queues.writer import DEFAULT_TTL_S
from relay_streams.model import shard_of

Q, S, KEY = "q" * 32, "s" * 32, "k" * 43
COMMON = {"origin": "o", "reply_slot": 0, "deadline_ms": 10**13}


def _cmd(model: type[schemas._QueueCommand], cid: str, **fields: object) -> bytes:
    return schemas.encode(model(id=cid, **COMMON, **fields))  # type: ignore[arg-type]


def _reply(
    cid: str, status: int, data: dict[str, object] | None = None, code: str | None = None
) -> bytes:
    return schemas.encode(
        schemas.QueueReply(id=cid, origin="o", status=status, data=data, code=code)
    )


SIGNED = {"queue": Q, "signed": "x", "sig": "eA"}


def _history() -> list[replay.Answered]:
    items = [
        (
            _cmd(schemas.CreateQueue, "c1", queue=Q, sender=S, recipient_key=KEY),
            _reply("c1", 201, {}),
        ),
        (
            _cmd(schemas.SendMessage, "c2", sender=S, msg_id="m1", body="YQ"),
            _reply("c2", 201, {"ts": 100}),
        ),
        (
            _cmd(schemas.SendMessage, "c3", sender=S, msg_id="m2", body="Yg", ttl_s=5),
            _reply("c3", 201, {"ts": 200}),
        ),
        # the same command read twice (a producer retry): applied once
        (
            _cmd(schemas.SendMessage, "c3", sender=S, msg_id="m2", body="Yg", ttl_s=5),
            _reply("c3", 201, {"ts": 200}),
        ),
        (_cmd(schemas.SendMessage, "c4", sender=S, msg_id="m3", body="Yw"), None),  # unanswered
        (_cmd(schemas.AckMessage, "c5", msg_id="m1", **SIGNED), _reply("c5", 200, {})),
        (_cmd(schemas.AckMessage, "c6", msg_id="m9", **SIGNED), _reply("c6", 404, code="NO_MSG")),
        (
            _cmd(schemas.SendMessage, "c7", sender=S, msg_id="m4", body="ZA"),
            _reply("c7", 429, code="QUOTA"),
        ),
        (
            _cmd(schemas.SendMessage, "c8", sender=S, msg_id="m5", body="ZQ"),
            _reply("c8", 429, code="QUOTA"),
        ),
        (_cmd(schemas.SuspendQueue, "c9", **SIGNED), _reply("c9", 200, {})),
        (b"not a record", None),
    ]
    return [replay.Answered(3, offset, c, r) for offset, (c, r) in enumerate(items)]


def test_queue_rules_follow_the_replies() -> None:
    state = replay.replay_queues(_history())
    assert state.queues[Q].status == "suspended"
    got = [(m.msg_id, m.ts, m.expires_ms, m.quota) for m in state.all_messages()]
    assert got == [("m2", 200, 200 + 5000, False), ("m4", None, None, True)]
    assert [(u.command, u.op, u.subject, u.msg_id) for u in state.uncertain] == [
        ("c4", "send", S, "m3")
    ]
    assert state.unreadable == 1


def test_a_retry_answered_with_the_first_send_adds_nothing() -> None:
    """An `Idempotency-Key` retry (decision 0016) is a new command whose 201 names the first
    send's msg_id, even once that message was acknowledged: it stored nothing."""
    create = _cmd(schemas.CreateQueue, "c1", queue=Q, sender=S, recipient_key=KEY)
    first = _cmd(schemas.SendMessage, "c2", sender=S, msg_id="m1", body="YQ", key="order-1")
    retry = _cmd(schemas.SendMessage, "c3", sender=S, msg_id="m2", body="Yg", key="order-1")
    items = [
        (create, _reply("c1", 201, {})),
        (first, _reply("c2", 201, {"msg_id": "m1", "ts": 100})),
        (retry, _reply("c3", 201, {"msg_id": "m1", "ts": 100})),
        (_cmd(schemas.AckMessage, "c4", msg_id="m1", **SIGNED), _reply("c4", 204)),
        (
            _cmd(schemas.SendMessage, "c5", sender=S, msg_id="m3", body="Yg", key="order-1"),
            _reply("c5", 201, {"msg_id": "m1", "ts": 100}),
        ),
    ]
    history = [replay.Answered(3, offset, c, r) for offset, (c, r) in enumerate(items)]
    assert replay.replay_queues(history).all_messages() == []
    without_ack = history[:3]
    assert [m.msg_id for m in replay.replay_queues(without_ack).all_messages()] == ["m1"]


def test_delete_removes_the_queue_and_default_ttl_applies() -> None:
    delete = replay.Answered(3, 50, _cmd(schemas.DeleteQueue, "d", **SIGNED), _reply("d", 204))
    history = [*_history()[:3], delete]
    state = replay.replay_queues(history[:2])
    assert state.all_messages()[0].expires_ms == 100 + DEFAULT_TTL_S * 1000
    state = replay.replay_queues(history)
    assert state.queues == {}
    assert state.all_messages() == []


def test_out_of_order_input_is_refused() -> None:
    history = _history()
    with pytest.raises(replay.ReplayOrderError):
        replay.replay_queues([history[2], history[1]])


def test_retained_last_write_wins_empty_deletes_unanswered_uncertain() -> None:
    def pub(rid: str, topic: str, payload: str, ts: int, expiry: int | None = None) -> bytes:
        return schemas.encode(
            schemas.Publication(
                id=rid, **COMMON, topic=topic, payload=payload, ts=ts, retain=True, expiry_s=expiry
            )
        )

    def ok(rid: str, status: int = 202) -> bytes:
        return schemas.encode(
            schemas.DsReply(id=rid, origin="o", partition=0, instance="r", site="s", status=status)
        )

    delete = schemas.encode(schemas.RetainedRequest(id="r5", **COMMON, op="delete", topic="b"))
    items = [
        replay.Answered(0, 0, pub("r1", "a", "MQ", 10), ok("r1")),
        replay.Answered(0, 1, pub("r2", "a", "Mg", 20, 60), ok("r2")),
        replay.Answered(0, 2, pub("r3", "b", "Mw", 30), ok("r3")),
        replay.Answered(0, 3, pub("r4", "c", "NA", 40), None),
        replay.Answered(0, 4, delete, ok("r5", 204)),
        replay.Answered(0, 5, pub("r1", "a", "MQ", 10), ok("r1")),  # an old copy read again
        replay.Answered(1, 0, pub("r6", "d", "", 50), ok("r6")),
    ]
    state = replay.replay_retained(items)
    assert {t: (m.payload, m.ts, m.expires_ms) for t, m in state.topics.items()} == {
        "a": ("Mg", 20, 20 + 60_000)
    }
    assert [u.subject for u in state.uncertain] == ["c"]


def test_streams_keep_answered_writes_only() -> None:
    def store(rid: str, *messages: tuple[str, str, int | None]) -> bytes:
        return schemas.encode(
            schemas.DsRequest(
                id=rid,
                **COMMON,
                op="store",
                db="messages",
                messages=tuple(
                    schemas.DsMessage(topic=t, payload=p, ts=ts) for t, p, ts in messages
                ),
            )
        )

    def answer(rid: str, status: int) -> bytes:
        return schemas.encode(
            schemas.DsReply(id=rid, origin="o", partition=0, instance="r", site="s", status=status)
        )

    read = schemas.encode(schemas.DsRequest(id="s9", **COMMON, op="streams", db="messages"))
    items = [
        replay.Answered(0, 0, store("s1", ("a", "MQ", 10), ("a", "MQ", 10)), answer("s1", 201)),
        replay.Answered(0, 1, store("s2", ("b", "Mg", 20)), None),  # never answered
        replay.Answered(0, 2, store("s3", ("c", "Mw", 30)), answer("s3", 400)),  # refused
        replay.Answered(0, 3, store("s4", ("d", "NA", None)), answer("s4", 201)),  # no ts
        replay.Answered(0, 4, read, answer("s9", 200)),
        replay.Answered(0, 5, store("s1", ("a", "MQ", 10), ("a", "MQ", 10)), answer("s1", 201)),
    ]
    state = replay.replay_streams(items)
    # both copies of s1 (a store keeps every copy written), once however often s1 was read
    assert [(m.topic, m.payload, m.ts, m.request) for m in state.messages] == [
        ("a", "MQ", 10, "s1"),
        ("a", "MQ", 10, "s1"),
    ]
    assert [(u.command, u.op, u.subject) for u in state.uncertain] == [("s2", "stream", "messages")]
    assert state.unstamped == 1


def test_a_stream_message_stands_on_its_own_shards_position() -> None:
    """A retainer's exact cut (`relay_archive.standing`): one write's messages in two shards
    are kept or left out by each shard's position; a write past every position is left out,
    not uncertain; a partition whose stores have no known position keeps the window."""
    in_0, in_1 = (next(f"t/{n}" for n in range(99) if shard_of(f"t/{n}", 2) == k) for k in (0, 1))

    def store(rid: str, *topics: str) -> bytes:
        messages = tuple(schemas.DsMessage(topic=t, payload="eA", ts=1) for t in topics)
        request = schemas.DsRequest(id=rid, **COMMON, op="store", db="messages", messages=messages)
        return schemas.encode(request)

    def answer(rid: str) -> bytes:
        return schemas.encode(
            schemas.DsReply(id=rid, origin="o", partition=0, instance="r", site="s", status=201)
        )

    shard_0, shard_1 = standing.stream_store("messages", 0), standing.stream_store("messages", 1)
    cut = standing.PublicationCut(
        {0: 0, 1: 3},
        {0: 0, 1: 8},
        {0: {shard_0: 6, shard_1: 5, standing.RETAINED: 0}},
        {0: {"messages": 2}},
    )
    items = [
        replay.Answered(0, 5, store("w1", in_0, in_1), answer("w1")),  # shard 0 has it, 1 not
        replay.Answered(0, 7, store("w2", in_0, in_1), None),  # past both: left out
        replay.Answered(1, 2, store("w3", in_0), answer("w3")),  # before the window
        replay.Answered(1, 4, store("w4", in_0), answer("w4")),  # in the window: uncertain
        replay.Answered(1, 9, store("w5", in_0), answer("w5")),  # past it
    ]
    state = replay.replay_streams(items, cut=cut)
    assert [(m.request, m.topic) for m in state.messages] == [("w1", in_0), ("w3", in_0)]
    assert [u.command for u in state.uncertain] == ["w4"]
    assert cut.retained(0, 0) == "out"
    assert standing.PublicationCut().stream(0, 99, "messages", in_0) == "in"  # no cut at all


def _tables(state: replay.QueueState) -> dict[str, pa.Table]:
    return {
        "queues": pa.Table.from_pylist(tables.queue_rows(state), schema=tables.QUEUES),
        "messages": pa.Table.from_pylist(tables.message_rows(state), schema=tables.MESSAGES),
        "retained": tables.RETAINED.empty_table(),
        "uncertain": pa.Table.from_pylist(
            tables.uncertain_rows(state.uncertain), schema=tables.UNCERTAIN
        ),
    }


def test_verify_classes() -> None:
    state = replay.replay_queues(_history())
    rebuilt = _tables(state)
    assert verify.compare(rebuilt, rebuilt, at_ms=0) == []
    live = {k: v for k, v in rebuilt.items()}
    messages = rebuilt["messages"].to_pylist()
    # the unanswered send was applied after all: explained, not EXTRA
    applied = {**messages[0], "msg_id": "m3", "ts": 300, "command": None}
    live["messages"] = pa.Table.from_pylist([*messages, applied], schema=tables.MESSAGES)
    (diff,) = verify.compare(rebuilt, live, at_ms=0)
    assert (diff.klass, diff.key) == (verify.EXPLAINED, "m3")
    # an acknowledged message lost live: MISSING, naming the queue and the send
    live["messages"] = pa.Table.from_pylist(messages[1:], schema=tables.MESSAGES)
    (diff,) = verify.compare(rebuilt, live, at_ms=0)
    assert (diff.klass, diff.key, diff.rebuilt and diff.rebuilt["command"]) == (
        verify.MISSING,
        "m2",
        "c3",
    )
    # ... unless it had expired by the cut
    (diff,) = verify.compare(rebuilt, live, at_ms=200 + 5000)
    assert diff.klass == verify.EXPLAINED
    # a changed body: MISMATCH
    changed = [{**messages[0], "body": "eHg"}, *messages[1:]]
    live["messages"] = pa.Table.from_pylist(changed, schema=tables.MESSAGES)
    (diff,) = verify.compare(rebuilt, live, at_ms=0)
    assert (diff.klass, diff.reason) == (verify.MISMATCH, "differs in body")
    assert verify.exit_code(verify.ArchiveHealth(), [diff]) == 1
    assert verify.exit_code(verify.ArchiveHealth(corrupt=["x"]), []) == 2
