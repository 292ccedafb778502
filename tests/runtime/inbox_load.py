"""A load put on Kafka as the ingress puts it, by a thread of its own, with the replies read
back from ingress inbox slot 0 by request id: the shared part of the hand-off tests' loads
(`test_queue_writer_handoff.Load`, `test_retainer_handoff.Load`)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from aiokafka import TopicPartition

from relay_bus import clients, schemas, topics
from tests import helpers

ANSWERS_TIMEOUT_S = 60.0


@dataclass
class InboxLoad:
    kafka: helpers.Kafka
    _: KW_ONLY
    origin: str = field(default_factory=lambda: f"load-{uuid.uuid4().hex[:8]}")
    replies: dict[str, Any] = field(default_factory=dict)
    """Request id → its reply (the subclass's reply record)."""
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    async def produce(self, producer: Any) -> None:
        """Put the load's records until `stop` (a subclass's)."""
        raise NotImplementedError

    def is_reply(self, record: object) -> bool:
        """Whether a record of the inbox answers this load (a subclass's kind)."""
        raise NotImplementedError

    def run_in_thread(self) -> None:
        threading.Thread(target=self._thread, daemon=True).start()

    def request(self) -> dict[str, Any]:
        """The fields every request of this load carries."""
        return {
            "id": uuid.uuid4().hex,
            "origin": self.origin,
            "reply_slot": 0,
            "deadline_ms": time.time() * 1000 + 120_000,
        }

    def topic(self, name: str) -> str:
        return self.kafka.prefix + name

    async def answered(self, ids: list[str]) -> None:
        """Wait for a reply to each of `ids`."""
        deadline = time.monotonic() + ANSWERS_TIMEOUT_S
        while any(i not in self.replies for i in ids):
            assert time.monotonic() < deadline, "answers missing"
            await asyncio.sleep(0.05)

    def _thread(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            self.done.set()

    async def _run(self) -> None:
        settings = self.kafka.settings()
        producer = clients.producer(settings, f"{self.origin}-p")
        consumer = clients.consumer(settings, f"{self.origin}-c", None)
        await producer.start()
        await consumer.start()
        inbox = TopicPartition(self.topic(topics.INGRESS_INBOX), 0)
        consumer.assign([inbox])
        await consumer.seek_to_end(inbox)
        await consumer.position(inbox)  # resolved now: no reply comes before it
        reader = asyncio.create_task(self._read(consumer))
        try:
            await self.produce(producer)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await producer.stop()
            await consumer.stop()

    async def _read(self, consumer: Any) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for raw in records:
                    record = schemas.decode(raw.value)
                    if self.is_reply(record) and getattr(record, "origin", None) == self.origin:
                        self.replies[record.id] = record  # type: ignore[attr-defined]
