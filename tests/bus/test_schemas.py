from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from relay_bus import schemas, topics
from relay_ds.info import Description
from relay_ds.sites import SiteId

_names = st.text(st.characters(codec="utf-8"), max_size=20)
_times = st.floats(0, 1e13, allow_nan=False)
_hops = st.builds(schemas.Hop, service=_names, instance=_names, received_ms=_times, sent_ms=_times)
_pings = st.builds(
    schemas.Ping,
    id=_names,
    origin=_names,
    reply_slot=st.integers(0, 1000),
    started_ms=_times,
    deadline_ms=_times,
    hops=st.lists(_hops, max_size=5).map(tuple),
)


@given(_pings)
def test_ping_round_trips(ping: schemas.Ping) -> None:
    assert schemas.decode(schemas.encode(ping)) == ping


def test_unknown_version_is_rejected_by_name() -> None:
    data = json.loads(schemas.encode(schemas.Epoch(epoch="e", created_by="i")))
    data["v"] = 2
    with pytest.raises(schemas.SchemaError, match="unsupported version 2 of 'epoch'"):
        schemas.decode(json.dumps(data).encode())


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "empty record"),
        (b"not json", "not a Relay record"),
        (b'{"kind": "nope", "v": 1}', "unknown record kind 'nope'"),
        (b'{"kind": "ping", "v": 1, "id": "x"}', "invalid 'ping' v1"),
    ],
)
def test_unreadable_records_raise_schema_error(raw: bytes | None, message: str) -> None:
    with pytest.raises(schemas.SchemaError, match=message):
        schemas.decode(raw)


def test_records_are_checked_against_their_topics() -> None:
    schemas.check_topic(schemas.Epoch(epoch="e", created_by="i"), topics.EPOCH)
    with pytest.raises(ValueError, match="may not be sent"):
        schemas.check_topic(schemas.Epoch(epoch="e", created_by="i"), topics.QUEUE_COMMANDS)


def test_a_hop_is_appended_without_changing_the_original() -> None:
    ping = schemas.Ping(id="p", origin="o", reply_slot=0, started_ms=1.0, deadline_ms=2.0)
    hopped = ping.with_hop("queue-writer", "qw-0", 1.5)
    assert ping.hops == ()
    assert [h.service for h in hopped.hops] == ["queue-writer"]
    assert hopped.expired(3.0)
    assert not hopped.expired(1.9)


_ROUTING = {"id": "r1", "origin": "ingress-0", "reply_slot": 3, "deadline_ms": 1e13}
_V1_BLANK = {
    "queue": "",
    "sender": "",
    "recipient_key": "",
    "msg_id": "",
    "body": "",
    "ttl_s": None,
    "signed": "",
    "sig": "",
    "slot": None,
    "conn": "",
}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"op": "create", "queue": "q", "sender": "s", "recipient_key": "k"},
            schemas.CreateQueue(**_ROUTING, queue="q", sender="s", recipient_key="k"),
        ),
        (
            {"op": "send", "sender": "s", "msg_id": "m", "body": "Ym9keQ", "ttl_s": 60},
            schemas.SendMessage(**_ROUTING, sender="s", msg_id="m", body="Ym9keQ", ttl_s=60),
        ),
        (
            {"op": "ack", "queue": "q", "msg_id": "m", "signed": "t", "sig": "x"},
            schemas.AckMessage(**_ROUTING, queue="q", msg_id="m", signed="t", sig="x"),
        ),
        (
            {"op": "sub", "queue": "q", "signed": "t", "sig": "x", "slot": 2, "conn": "c"},
            schemas.SubscribeQueue(**_ROUTING, queue="q", signed="t", sig="x", slot=2, conn="c"),
        ),
    ],
)
def test_v1_queue_commands_are_read_as_their_v2_model(
    fields: dict[str, object], expected: schemas.QueueCommand
) -> None:
    v1 = {"kind": "queue_cmd", "v": 1, **_ROUTING, **_V1_BLANK, **fields}
    decoded = schemas.decode(json.dumps(v1).encode())
    assert decoded == expected
    assert schemas.decode(schemas.encode(decoded)) == expected  # written as v2
    assert json.loads(schemas.encode(decoded))["v"] == 2


def test_a_v1_command_missing_what_its_operation_needs_is_unreadable() -> None:
    v1 = {"kind": "queue_cmd", "v": 1, **_ROUTING, **_V1_BLANK, "op": "sub", "queue": "q"}
    with pytest.raises(schemas.SchemaError, match="invalid 'queue_cmd' v1"):
        schemas.decode(json.dumps(v1).encode())


def test_a_v2_command_carries_only_its_operations_fields() -> None:
    head = schemas.ReadHead(**_ROUTING, queue="q", signed="t", sig="x")
    assert set(json.loads(schemas.encode(head))) == {
        *_ROUTING,
        "kind",
        "v",
        "op",
        "queue",
        "signed",
        "sig",
    }
    extra = {**json.loads(schemas.encode(head)), "slot": 1}
    with pytest.raises(schemas.SchemaError, match="invalid 'queue_cmd' v2"):
        schemas.decode(json.dumps(extra).encode())


_RETAINER_ANSWERS: list[object] = [
    schemas.Stored(stored=3),
    schemas.StreamsFound(streams=[schemas.RankedStream(rank=(4, 1), stream="0.s")]),
    schemas.IteratorMade(iterator="1.i"),
    schemas.NextMessages(
        messages=[schemas.StoredMessage(topic="a/b", payload="eA", ts=5)],
        iterator="1.j",
        end_of_stream=False,
    ),
    schemas.RetainedMessage(topic="a/b", payload="eA", ts=5, expires_at=None),
    schemas.RetainedMatch(
        messages=[schemas.RetainedMessage(topic="a", payload="", ts=0, expires_at=9)], more=True
    ),
    schemas.RetainedTopics(messages=[schemas.RetainedTopic(topic="a")], more=False),
    schemas.RetainedSize(size=2),
    Description(site=SiteId("0" * 16), node="n", partitions=[0], sites=[], storages=[]),
]


@pytest.mark.parametrize("answer", _RETAINER_ANSWERS, ids=lambda a: type(a).__name__)
def test_a_retainer_answer_is_read_back_as_its_model_and_no_other(answer: object) -> None:
    data = TypeAdapter(type(answer)).dump_python(answer, mode="json")
    reply = schemas.DsReply(
        id="r", origin="o", partition=0, instance="i", site="s", status=200, data=data
    )
    decoded = schemas.decode(schemas.encode(reply))
    assert isinstance(decoded, schemas.DsReply)
    assert decoded.answer(type(answer)) == answer
    assert decoded.model_copy(update={"data": None}).answer(type(answer)) is None
    others = [a for a in _RETAINER_ANSWERS if type(a) is not type(answer)]
    for other in others:  # every shape is told from every other
        with pytest.raises(
            schemas.SchemaError, match=f"ds_reply data is not a {type(other).__name__}"
        ):
            decoded.answer(type(other))


_VIEW = schemas.KvView(version=3, sites=["A", "B"])
_REPLICATOR_ANSWERS: list[schemas.KvAnswer] = [
    schemas.KvVersion(version="1700000000000.0.A"),
    schemas.KvRegister(value="eA", version="1.0.A", expires_at=None),
    schemas.KvMembers(members=["bQ"], cursor="bQ"),
    schemas.KvFields(fields=[schemas.KvField(field="f", value="", version="1.0.A")], cursor=None),
    schemas.KvNamespace(token="t", n=3, r=2, w=2, gc_grace_s=0),
    schemas.KvMembership(
        site="A",
        established=True,
        view=_VIEW,
        sites={"A": "http://a"},
        change=schemas.KvViewChange(old=_VIEW, new=schemas.KvView(version=4, sites=["A"])),
        participants=["A", "B"],
        reports={"A": 1},
        down=["B"],
        max_n=2,
    ),
    schemas.KvViewChanging(version=4),
]


@pytest.mark.parametrize("answer", _REPLICATOR_ANSWERS, ids=lambda a: type(a).__name__)
def test_a_replicator_answer_is_read_back_as_its_model_and_no_other(
    answer: schemas.KvAnswer,
) -> None:
    reply = schemas.KvReply(id="r", origin="o", instance="i", status=200, data=answer.model_dump())
    decoded = schemas.decode(schemas.encode(reply))
    assert isinstance(decoded, schemas.KvReply)
    assert decoded.answer(type(answer)) == answer
    assert decoded.model_copy(update={"data": None}).answer(type(answer)) is None
    for other in _REPLICATOR_ANSWERS:  # every shape is told from every other
        if type(other) is not type(answer):
            with pytest.raises(
                schemas.SchemaError, match=f"kv_reply data is not a {type(other).__name__}"
            ):
                decoded.answer(type(other))


def test_a_kv_version_is_not_a_view_version() -> None:
    """A write's version (a clock stamp, text) and a view's (an integer) are told apart even
    when the text is digits."""
    reply = schemas.KvReply(id="r", origin="o", instance="i", status=202, data={"version": "4"})
    with pytest.raises(schemas.SchemaError, match="not a KvViewChanging"):
        reply.answer(schemas.KvViewChanging)
    assert reply.answer(schemas.KvVersion) == schemas.KvVersion(version="4")


_OWNER_ANSWERS: list[schemas.AdminAnswer] = [
    schemas.DumpStarted(dump=4),
    schemas.DumpFinished(dump=4, records=2, bytes=300, pause_ms=0.25, total_s=0.5),
    schemas.QueueWriterStats(queues=1, messages=2, bytes=3, open_queues=0),
    schemas.QueuePart(
        folder="/d/exports/x",
        epoch="e",
        at_ms=7,
        offsets={"0": 3},
        queues=1,
        messages=2,
        early=0,
        longest_ms=0.5,
        read_s=0.0,
        total_s=0.1,
    ),
    schemas.RetainerPart(
        folder="/d/exports/x",
        epoch="e",
        at_ms=7,
        publications={"0": 3},
        publications_upto={"0": 4},
        stores={"0": {"retained": 3}},
        exact=True,
        retained=1,
        streams=0,
        pause_ms=0.5,
        writes_during=2,
        before_ms=0.25,
        total_s=0.1,
    ),
]


@pytest.mark.parametrize("answer", _OWNER_ANSWERS, ids=lambda a: type(a).__name__)
def test_an_admin_answer_is_read_back_as_its_model_and_no_other(
    answer: schemas.AdminAnswer,
) -> None:
    reply = schemas.AdminReply(
        id="r", origin="o", partition=0, instance="i", result=answer.model_dump()
    )
    decoded = schemas.decode(schemas.encode(reply))
    assert isinstance(decoded, schemas.AdminReply)
    assert decoded.answer(type(answer)) == answer
    for other in _OWNER_ANSWERS:  # every shape is told from every other
        if type(other) is not type(answer):
            with pytest.raises(
                schemas.SchemaError, match=f"admin_reply data is not a {type(other).__name__}"
            ):
                decoded.answer(type(other))


def test_an_export_part_from_a_retainer_before_marks_is_still_read() -> None:
    """A retainer from before exact cuts answered without `stores`, `exact`, `writes_during`
    and `before_ms`: its `admin_reply` still decodes and its part reads with their defaults."""
    older = (
        b'{"kind":"admin_reply","v":1,"id":"r","origin":"o","partition":0,"instance":"i",'
        b'"result":{"folder":"/x","epoch":"e","at_ms":1,"publications":{"0":2},'
        b'"publications_upto":{"0":3},"retained":0,"streams":1,"pause_ms":0.5,"total_s":1.0}}'
    )
    decoded = schemas.decode(older)
    assert isinstance(decoded, schemas.AdminReply)
    part = decoded.answer(schemas.RetainerPart)
    assert (part.stores, part.exact, part.writes_during, part.before_ms) == ({}, False, 0, 0.0)
    assert schemas.encode(decoded) == older  # the record itself is kept as it came
