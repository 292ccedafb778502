"""Live publications: each publication read from `relay.publications` goes to every WebSocket
connection whose topic filter matches it, as one `fanout` record per ingress inbox slot.

Invariants:
- a publication read from partition p is matched against the subscriptions in force at that
  point of p's log: `topic_sub` records are applied per partition (`FilterIndex`), since every
  ingress sends each change to every partition;
- on taking a partition over this instance notes its end offset, loads every subscription
  Redis lists (`relay_routes.topic_subscriptions`), and reads from that offset on: changes
  before it are in Redis (an ingress writes Redis first), changes after it are read;
- a connection matched by several of its filters gets the publication once; fanouts leave in
  the order publications were read (`Bus.post`). A retained publish with an empty payload
  (a delete) still goes to live subscribers, with its empty payload (MQTT 3.3.1.3). Live
  publications are at most once: nothing is sent again after a delivery restart.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import structlog
from redis.exceptions import RedisError

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_routes.topic_subscriptions import TopicSubscriptions
from relay_topics import rules as topic_rules
from relay_topics.index import FilterIndex

log = structlog.get_logger(__name__)

REDIS_RETRY_S = 1.0


class LivePublications:
    def __init__(
        self, bus: Bus, registry: TopicSubscriptions, inbox_slots: int, instance: str
    ) -> None:
        self.bus = bus
        self.registry = registry
        self.inbox_slots = inbox_slots
        self.instance = instance
        self.index = FilterIndex()

    async def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        offsets = await self.bus.end_offsets(topics.PUBLICATIONS, partitions)
        while True:
            try:
                listed = await self.registry.every(self.inbox_slots)
                break
            except (RedisError, OSError) as error:
                log.warning("topic_subscriptions_waiting_for_redis", error=str(error))
                await asyncio.sleep(REDIS_RETRY_S)
        for partition in partitions:
            self.index.drop_partition(partition)
            for slot, conn, topic_filter in listed:
                self.index.add(partition, topic_rules.levels(topic_filter), (slot, conn))
        log.info("publications_taken_over", partitions=partitions, subscriptions=len(listed))
        return offsets

    async def revoked(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.index.drop_partition(partition)

    def subscription(self, change: schemas.TopicSubscription, partition: int) -> None:
        if change.op == "drop_slot":
            self.index.drop_slot(partition, change.slot)
        elif change.op == "add":
            self.index.add(partition, topic_rules.levels(change.filter), (change.slot, change.conn))
        else:
            self.index.remove(
                partition, topic_rules.levels(change.filter), (change.slot, change.conn)
            )

    def publish(self, publication: schemas.Publication, partition: int) -> None:
        by_slot: dict[int, list[str]] = defaultdict(list)
        for slot, conn in self.index.match(partition, topic_rules.levels(publication.topic)):
            by_slot[slot].append(conn)
        for slot, conns in sorted(by_slot.items()):
            fanout = schemas.Fanout(
                conns=tuple(sorted(conns)),
                topic=publication.topic,
                payload=publication.payload,
                ts=publication.ts,
            )
            self.bus.post(topics.INGRESS_INBOX, fanout, partition=slot)

    async def handle(self, received: Received) -> None:
        record = received.record
        if isinstance(record, schemas.Publication):
            self.publish(record, received.partition)
        elif isinstance(record, schemas.TopicSubscription):
            self.subscription(record, received.partition)
        # durable-stream and retained requests and pings are for the retainer
