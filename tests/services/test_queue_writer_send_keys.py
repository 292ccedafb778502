"""The queue-writer's command handler and send keys, in process over a real journal and store
log: a SEND record put on Kafka twice (a producer retry) is stored once even when the copy
arrives after a restart, a retry with the same `Idempotency-Key` is answered with the first
send after the message was acknowledged and the writer restarted, and a malformed key in a
record is BAD_REQUEST and changes nothing (the ingress checks first; this is the second line)."""

from __future__ import annotations

from pathlib import Path

from relay_bus import schemas
from relay_queues import ids
from tests.helpers import RecordingBus
from tests.services.test_queue_writer_commands import PARTITIONS, Writer, _routing


async def _created(writer: Writer, queue: str, sender: str, p: int) -> None:
    create = schemas.CreateQueue(**_routing("c"), queue=queue, sender=sender, recipient_key="k")
    await writer.handle(create, p, 0)
    assert (await writer.answer("c")).status == 201


async def test_a_producer_retry_after_a_restart_is_stored_once(tmp_path: Path) -> None:
    queue, sender = ids.new_queue_ids(PARTITIONS)
    p = ids.partition_of(queue, PARTITIONS)
    send = schemas.SendMessage(
        **_routing("s"), sender=sender, msg_id=ids.new_id(), body=ids.b64u(b"x")
    )
    async with Writer(tmp_path, RecordingBus()) as writer:
        await _created(writer, queue, sender, p)
        await writer.handle(send, p, 1)
        first = await writer.answer("s")
        assert first.status == 201
    bus = RecordingBus()
    async with Writer(tmp_path, bus) as writer:
        assert writer.offsets[p] == 2
        await writer.handle(send, p, 2)  # the same record, at the next offset
        again = await writer.answer("s")
        assert (again.status, again.data) == (201, first.data)
        assert [m.msg_id for m in writer.commands.rules.journal.messages(queue)] == [
            ids.id_bytes(send.msg_id)
        ]


async def test_a_keyed_retry_after_ack_and_restart_answers_the_first_send(
    tmp_path: Path,
) -> None:
    queue, sender = ids.new_queue_ids(PARTITIONS)
    p = ids.partition_of(queue, PARTITIONS)

    def send(request_id: str, body: bytes, key: str) -> schemas.SendMessage:
        fields = {"sender": sender, "msg_id": ids.new_id(), "body": ids.b64u(body), "key": key}
        return schemas.SendMessage(**_routing(request_id), **fields)

    async with Writer(tmp_path, RecordingBus()) as writer:
        await _created(writer, queue, sender, p)
        await writer.handle(send("s1", b"one", "pay-1"), p, 1)
        first = await writer.answer("s1")
        assert first.status == 201
        journal = writer.commands.rules.journal
        journal.ack(queue, journal.messages(queue)[0].msg_id)  # delivered and acknowledged
        bad = send("s2", b"two", "no spaces")
        await writer.handle(bad, p, 2)
        refused = await writer.answer("s2")
        assert (refused.status, refused.code) == (400, "BAD_REQUEST")
        assert journal.messages(queue) == []
    async with Writer(tmp_path, RecordingBus()) as writer:
        await writer.handle(send("s3", b"other body", "pay-1"), p, 3)
        again = await writer.answer("s3")
        assert (again.status, again.data) == (201, first.data)
        assert writer.commands.rules.journal.messages(queue) == []
        await writer.handle(send("s4", b"new", "pay-2"), p, 4)
        assert (await writer.answer("s4")).status == 201
        assert [m.body for m in writer.commands.rules.journal.messages(queue)] == [b"new"]
