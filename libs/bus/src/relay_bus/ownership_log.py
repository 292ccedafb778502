"""The `relay.ownership` topic: what each stateful instance last accepted, readable by all.

One partition, compacted, keyed `<service>/<ordinal>`; each value is the JSON of the assignment
that instance accepted (`relay_runtime.assignment`), with `service` and `ordinal`. One partition
gives every record a single order, which the fencing rule needs: an instance publishes its
acceptance, then reads the topic to its end, so of two instances that both want a partition the
one that published second sees the other's record (`relay_runtime.assignment.serving`).

Invariants:
- `publish` returns only once the broker has the record (acks=all);
- `read` returns the last valid record of every ordinal of the service up to the end offset at
  the time of the call, so it includes everything published before it was called; records of
  other services and unreadable records are skipped (the latter logged).
"""

from __future__ import annotations

import asyncio
import json
import time

import structlog

from relay_bus import clients, topics
from relay_bus.config import KafkaSettings
from relay_runtime import assignment

log = structlog.get_logger(__name__)

READ_POLL_MS = 500


class OwnershipLog:
    """`start` before use (it creates the topic if missing), `close` after."""

    def __init__(self, settings: KafkaSettings, service: str, client_id: str) -> None:
        self.settings = settings
        self.service = service
        self.client_id = client_id
        self.topic = settings.topic_prefix + topics.OWNERSHIP
        self._tp = clients.TopicPartition(self.topic, 0)
        self._producer: clients.AIOKafkaProducer | None = None
        self._reader: clients.AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect (the bus has created the topic: `relay_bus.topics.OWNERSHIP`)."""
        self._producer = clients.producer(self.settings, f"{self.client_id}-ownership")
        await self._producer.start()
        self._reader = clients.consumer(self.settings, f"{self.client_id}-ownership", None)
        await self._reader.start()
        self._reader.assign([self._tp])

    async def publish(self, ordinal: int, accepted: assignment.Assignment) -> None:
        assert self._producer is not None, "not started"
        value = {"v": assignment.FORMAT_VERSION, "service": self.service, "ordinal": ordinal}
        value |= accepted.to_json()
        await self._producer.send_and_wait(
            self.topic,
            json.dumps(value).encode(),
            key=f"{self.service}/{ordinal}".encode(),
            partition=0,
        )

    async def read(
        self, partitions: int, timeout_s: float = 10.0
    ) -> dict[int, assignment.Assignment]:
        """Ordinal → the assignment it last published, for this service."""
        assert self._reader is not None, "not started"
        async with self._lock:
            end = (await self._reader.end_offsets([self._tp]))[self._tp]
            await self._reader.seek_to_beginning(self._tp)
            found: dict[int, assignment.Assignment] = {}
            deadline = time.monotonic() + timeout_s
            while await self._reader.position(self._tp) < end:
                if time.monotonic() > deadline:
                    raise clients.KafkaError(f"{self.topic} was not read to offset {end} in time")
                batch = await self._reader.getmany(self._tp, timeout_ms=READ_POLL_MS)
                for message in batch.get(self._tp, []):
                    if message.offset >= end:
                        break
                    self._take(message.value, partitions, found)
            return found

    def _take(
        self, value: bytes | None, partitions: int, found: dict[int, assignment.Assignment]
    ) -> None:
        try:
            record = json.loads(value or b"")
            if record.get("service") != self.service:
                return
            ordinal = record["ordinal"]
            found[int(ordinal)] = assignment.parse(record, partitions)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("ownership_record_skipped", topic=self.topic, error=str(error))

    async def close(self) -> None:
        for client in (self._reader, self._producer):
            if client is not None:
                await client.stop()
        self._reader = self._producer = None
