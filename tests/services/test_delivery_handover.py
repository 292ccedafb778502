"""Delivery's handling of takeovers across restarts (issue 18), in process: real Redis for the
subscription registry, what it hands to Relay's bus recorded.

- taking a partition over resyncs each registered subscriber with its SUB order and sends END
  to each subscriber the registry says it replaced;
- a queue-writer's `writer_started` resyncs every registered subscription of that partition,
  and sends no END;
- an ingress's `registered` notice of a SUB this instance never saw asks for a resync; of one
  it saw, nothing.
"""

from __future__ import annotations

import asyncio

from relay_bus import schemas, topics
from relay_bus.consumers import Received
from relay_delivery.pushes import Pushes
from relay_queues import ids
from relay_queues.delivery import Head
from relay_routes import client
from relay_routes.subscriptions import Subscriptions
from tests.helpers import RecordingBus

PARTITIONS = 4


async def _no_ping(_: Received) -> None:
    raise AssertionError("not a ping")


def _queue_on(partition: int) -> str:
    while True:
        queue = ids.new_id()
        if ids.partition_of(queue, PARTITIONS) == partition:
            return queue


def _resyncs(bus: RecordingBus) -> list[tuple[str, int, str, int]]:
    return [
        (r.queue, r.slot, r.conn, r.since)
        for t, r, _ in bus.posted
        if t == topics.QUEUE_COMMANDS and isinstance(r, schemas.QueueResync)
    ]


def _ends(bus: RecordingBus) -> list[tuple[str, str, int | None]]:
    return [
        (r.queue, r.conn, p)
        for t, r, p in bus.posted
        if t == topics.INGRESS_INBOX and isinstance(r, schemas.Deliver) and r.frame == "END"
    ]


async def _settled(bus: RecordingBus, resyncs: int) -> None:
    for _ in range(200):
        if len(_resyncs(bus)) >= resyncs:
            return
        await asyncio.sleep(0.02)


async def test_a_takeover_ends_the_replaced_subscriber_and_resyncs_the_current_one(
    redis_url: str,
) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    handed_over, alone = _queue_on(1), _queue_on(1)
    await registry.claim(1, handed_over, 0, "first", 10)
    await registry.claim(1, handed_over, 2, "second", 20)  # took it over; delivery then died
    await registry.claim(1, alone, 0, "only", 30)
    bus = RecordingBus(end=7)
    pushes = Pushes(bus, registry, PARTITIONS, "delivery-0")
    assert await pushes.start_offsets([1]) == {1: 7}
    await _settled(bus, 2)
    assert sorted(_resyncs(bus)) == sorted([(handed_over, 2, "second", 20), (alone, 0, "only", 30)])
    assert _ends(bus) == [(handed_over, "first", 0)]
    await pushes.close()
    await redis.aclose()


async def test_a_queue_writer_start_resyncs_its_partition_without_ends(redis_url: str) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    queue, elsewhere = _queue_on(2), _queue_on(3)
    await registry.claim(2, queue, 0, "first", 10)
    await registry.claim(2, queue, 1, "second", 20)
    await registry.claim(3, elsewhere, 1, "other", 30)
    bus = RecordingBus()
    pushes = Pushes(bus, registry, PARTITIONS, "delivery-0")
    handle = pushes.handler(_no_ping)
    head = Head(ids.new_id(), 1, "Ym9keQ")
    subscribed = schemas.QueueEvent(
        event="subscribed", queue=queue, lsn=1, head=head, slot=1, conn="second", since=20
    )
    await handle(Received(topics.QUEUE_EVENTS, 2, 0, None, subscribed))
    started = schemas.QueueEvent(event="writer_started", queue="")
    await handle(Received(topics.QUEUE_EVENTS, 2, 1, None, started))
    await _settled(bus, 1)
    assert _resyncs(bus) == [(queue, 1, "second", 20)]
    assert _ends(bus) == []
    # The queue-writer's answer: the head it already has is not pushed again; a new one is.
    after = Head(ids.new_id(), 2, "YWdhaW4")
    for lsn, answer in [(2, head), (3, after)]:
        again = subscribed.model_copy(update={"lsn": lsn, "head": answer})
        await handle(Received(topics.QUEUE_EVENTS, 2, 1 + lsn, None, again))
    pushed = [r.head.msg_id for t, r, _ in bus.posted if isinstance(r, schemas.Deliver) and r.head]
    assert pushed == [head.msg_id, after.msg_id]
    await pushes.close()
    await redis.aclose()


async def _until_posted(bus: RecordingBus, count: int) -> None:
    for _ in range(200):
        if len(bus.posted) >= count:
            return
        await asyncio.sleep(0.02)


async def test_a_notice_of_an_unseen_sub_asks_for_a_resync_if_the_registry_names_it(
    redis_url: str,
) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    bus = RecordingBus()
    pushes = Pushes(bus, registry, PARTITIONS, "delivery-0")
    handle = pushes.handler(_no_ping)
    queue, gone = _queue_on(0), _queue_on(0)

    def notice(queue: str, conn: str, since: int) -> Received:
        record = schemas.QueueEvent(event="registered", queue=queue, slot=1, conn=conn, since=since)
        return Received(topics.QUEUE_EVENTS, 0, since, None, record)

    await registry.claim(0, queue, 1, "missed", 40)
    await handle(notice(queue, "missed", 40))
    await _until_posted(bus, 1)
    assert _resyncs(bus) == [(queue, 1, "missed", 40)]
    await handle(notice(gone, "closed", 41))  # its connection closed since: nothing
    seen = schemas.QueueEvent(
        event="subscribed", queue=queue, lsn=1, head=None, slot=1, conn="seen", since=50
    )
    await handle(Received(topics.QUEUE_EVENTS, 0, 42, None, seen))
    await handle(notice(queue, "seen", 50))  # seen already: nothing
    await handle(notice(queue, "missed", 40))  # older than the SUB in force: END
    await _until_posted(bus, 2)
    assert _ends(bus) == [(queue, "missed", 1)]
    # A notice read again after a restart, of a subscriber the registry says was replaced.
    await registry.claim(0, queue, 1, "seen", 50)
    fresh = Pushes(bus, registry, PARTITIONS, "delivery-1")
    await fresh.handler(_no_ping)(notice(queue, "missed", 40))
    await _until_posted(bus, 3)
    assert _ends(bus) == [(queue, "missed", 1), (queue, "missed", 1)]
    assert len(_resyncs(bus)) == 1
    assert len(bus.posted) == 3
    await fresh.close()
    await pushes.close()
    await redis.aclose()
