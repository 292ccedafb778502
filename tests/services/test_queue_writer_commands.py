"""The queue-writer's command handler in process: real journal and store log on `tmp_path`,
what it hands to Relay's bus recorded (Kafka itself is crossed by the suite tests). Replies leave
only once durable, a record consumed twice changes nothing, an expired command is dropped
unapplied, and after a restart each partition resumes after its last applied command."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_bus import schemas, topics
from relay_bus.consumers import Received
from relay_queue_writer.commands import Commands
from relay_queue_writer.stores import Stores
from relay_queues import auth, ids
from relay_runtime.readiness import Readiness
from tests.helpers import RecordingBus

PARTITIONS = 4


def _routing(request_id: str, deadline_s: float = 60) -> dict[str, object]:
    return {
        "id": request_id,
        "origin": "ingress-0",
        "reply_slot": 5,
        "deadline_ms": (time.time() + deadline_s) * 1000,
    }


class Writer:
    def __init__(self, tmp_path: Path, bus: RecordingBus) -> None:
        self.stores = Stores(tmp_path, Readiness(), 0, repair=False)
        self.commands = Commands(bus, self.stores, PARTITIONS, 3600)
        self.bus = bus
        self.offsets: dict[int, int] = {}

    async def __aenter__(self) -> Writer:
        await self.stores.open()
        await self.commands.open()
        self.offsets = await self.commands.start_offsets(list(range(PARTITIONS)))
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.commands.close()
        await self.stores.close()

    async def handle(self, record: schemas.Record, partition: int, offset: int) -> None:
        received = Received(topics.QUEUE_COMMANDS, partition, offset, None, record)
        await self.commands.handle(received)

    async def answer(self, request_id: str) -> schemas.QueueReply:
        for _ in range(200):
            reply = self.bus.replies().get(request_id)
            if reply is not None:
                return reply
            await asyncio.sleep(0.01)
        raise AssertionError(f"no reply to {request_id}")


async def test_create_send_and_read_answer_once_durable(tmp_path: Path) -> None:
    bus = RecordingBus()
    key = Ed25519PrivateKey.generate()
    public = ids.b64u(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    queue, sender = ids.new_queue_ids(PARTITIONS)
    p = ids.partition_of(queue, PARTITIONS)
    async with Writer(tmp_path, bus) as writer:
        assert writer.offsets == dict.fromkeys(range(PARTITIONS), 0)
        create = schemas.CreateQueue(
            **_routing("c"), queue=queue, sender=sender, recipient_key=public
        )
        await writer.handle(create, p, 0)
        created = await writer.answer("c")
        assert created.status == 201
        answer = created.answer(schemas.QueueCreated)
        assert answer is not None
        assert (answer.recipient_id, answer.sender_id) == (queue, sender)
        body = ids.b64u(b"hello")
        send = schemas.SendMessage(**_routing("s"), sender=sender, msg_id=ids.new_id(), body=body)
        await writer.handle(send, p, 1)
        sent = await writer.answer("s")
        assert sent.status == 201
        events = [r for t, r, _ in bus.posted if t == topics.QUEUE_EVENTS]
        assert isinstance(events[-1], schemas.QueueEvent)
        assert events[-1].head is not None
        assert events[-1].head.body == body
        assert sent.answer(schemas.Sent) == schemas.Sent(msg_id=send.msg_id, ts=events[-1].head.ts)
        ts = int(time.time())
        text = auth.rest_text("GET", f"/v1/queues/{queue}/head", ts, b"")
        head = schemas.ReadHead(
            **_routing("h"), queue=queue, signed=text, sig=ids.b64u(key.sign(text.encode()))
        )
        await writer.handle(head, p, 2)
        read = await writer.answer("h")
        assert (read.status, read.data) == (200, events[-1].head.frame())
        assert read.answer(schemas.QueueMessage) == schemas.QueueMessage(
            msg_id=send.msg_id, ts=events[-1].head.ts, body=body
        )
        with pytest.raises(schemas.SchemaError, match="not a QueueInfo"):
            read.answer(schemas.QueueInfo)
        # The reply reaches the asker's inbox slot.
        assert [part for t, r, part in bus.posted if r is read] == [5]


async def test_a_record_consumed_twice_or_expired_changes_nothing(tmp_path: Path) -> None:
    bus = RecordingBus()
    queue, sender = ids.new_queue_ids(PARTITIONS)
    p = ids.partition_of(queue, PARTITIONS)
    async with Writer(tmp_path, bus) as writer:
        create = schemas.CreateQueue(**_routing("c"), queue=queue, sender=sender, recipient_key="k")
        await writer.handle(create, p, 0)
        await writer.answer("c")
        body = ids.b64u(b"x")
        send = schemas.SendMessage(**_routing("s1"), sender=sender, msg_id=ids.new_id(), body=body)
        await writer.handle(send, p, 1)
        await writer.answer("s1")
        posted = len(bus.posted)
        await writer.handle(send, p, 1)  # the same offset again
        late = schemas.SendMessage(
            **_routing("s2", -1), sender=sender, msg_id=ids.new_id(), body=body
        )
        await writer.handle(late, p, 2)
        await asyncio.sleep(0.2)
        assert len(bus.posted) == posted
        assert len(writer.commands.rules.journal.messages(queue)) == 1


async def test_a_restart_resumes_each_partition_after_its_last_applied_command(
    tmp_path: Path,
) -> None:
    bus = RecordingBus()
    queue, sender = ids.new_queue_ids(PARTITIONS)
    p = ids.partition_of(queue, PARTITIONS)
    async with Writer(tmp_path, bus) as writer:
        create = schemas.CreateQueue(**_routing("c"), queue=queue, sender=sender, recipient_key="k")
        await writer.handle(create, p, 7)
        await writer.answer("c")
    async with Writer(tmp_path, RecordingBus()) as again:
        assert again.offsets[p] == 8
        assert all(again.offsets[o] == 0 for o in range(PARTITIONS) if o != p)
    async with Writer(tmp_path, RecordingBus(epoch="epoch-2")) as wiped:
        assert wiped.offsets == dict.fromkeys(range(PARTITIONS), 0)  # another log: from 0
