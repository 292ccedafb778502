"""Delivery's event handler in process: real Redis for the subscription registry, what it hands
to Relay's bus recorded. Events become MSG and END pushes to the subscriber's inbox slot; taking
a partition over starts at its end offset and resyncs every subscription Redis lists for it."""

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


def _event(kind: str, queue: str, lsn: int, head: Head | None = None, **to: object) -> Received:
    record = schemas.QueueEvent(event=kind, queue=queue, lsn=lsn, head=head, **to)
    return Received(topics.QUEUE_EVENTS, ids.partition_of(queue, PARTITIONS), lsn, None, record)


def _pushes(bus: RecordingBus) -> list[tuple[str, str, str | None, int | None]]:
    return [
        (r.frame, r.conn, r.head.msg_id if r.head else None, part)
        for topic, r, part in bus.posted
        if topic == topics.INGRESS_INBOX and isinstance(r, schemas.Deliver)
    ]


async def test_events_become_pushes_to_the_subscribers_slot(redis_url: str) -> None:
    bus = RecordingBus()
    pushes = Pushes(bus, Subscriptions(client.connect(redis_url)), PARTITIONS, "delivery-0")

    async def no_ping(_: Received) -> None:
        raise AssertionError("not a ping")

    handle = pushes.handler(no_ping)
    queue = ids.new_id()
    first, second = Head(ids.new_id(), 1, "Ym9keQ"), Head(ids.new_id(), 2, "YWdhaW4")
    await handle(_event("subscribed", queue, 1, first, slot=3, conn="c1"))
    assert _pushes(bus) == [("MSG", "c1", first.msg_id, 3)]
    await handle(_event("changed", queue, 2, first))  # the same head, still in flight: nothing
    assert len(_pushes(bus)) == 1
    await handle(_event("changed", queue, 3, second))  # acked: the next head goes out
    assert _pushes(bus)[-1] == ("MSG", "c1", second.msg_id, 3)
    third = Head(ids.new_id(), 3, "dGhpcmQ")
    await handle(_event("read", queue, 4, third))  # read over REST: handed out, not pushed
    assert len(_pushes(bus)) == 2
    await handle(_event("subscribed", queue, 5, third, slot=5, conn="c2"))  # taken over
    assert _pushes(bus)[-2:] == [("END", "c1", None, 3), ("MSG", "c2", third.msg_id, 5)]
    await handle(_event("changed", queue, 1, None))  # older than what was applied: ignored
    assert len(_pushes(bus)) == 4
    await handle(_event("deleted", queue, 6))
    assert _pushes(bus)[-1] == ("END", "c2", None, 5)
    await pushes.close()


async def test_a_takeover_starts_at_the_end_and_resyncs_what_redis_lists(redis_url: str) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    queues = [ids.new_id() for _ in range(12)]
    for n, queue in enumerate(queues):
        await registry.claim(ids.partition_of(queue, PARTITIONS), queue, n % 3, f"c{n}", n + 1)
    bus = RecordingBus(end=42)
    pushes = Pushes(bus, registry, PARTITIONS, "delivery-0")
    assert await pushes.start_offsets([0, 2]) == {0: 42, 2: 42}
    expected = {q for q in queues if ids.partition_of(q, PARTITIONS) in (0, 2)}
    for _ in range(100):
        resyncs = [r for t, r, _ in bus.posted if isinstance(r, schemas.QueueResync)]
        if len(resyncs) >= len(expected):
            break
        await asyncio.sleep(0.02)
    assert {r.queue for r in resyncs} == expected
    for topic, record, partition in bus.posted:
        assert isinstance(record, schemas.QueueResync)
        assert topic == topics.QUEUE_COMMANDS
        assert partition == ids.partition_of(record.queue, PARTITIONS)
        n = queues.index(record.queue)
        assert (record.slot, record.conn) == (n % 3, f"c{n}")
    await pushes.close()
    await redis.aclose()


async def test_a_writer_started_on_a_partition_restarts_its_queues_ordering(
    redis_url: str,
) -> None:
    """A queue-writer that took a partition over (a move) counts lsns in its own journal,
    possibly lower than the one before: after its `writer_started`, its events are not stale."""
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    bus = RecordingBus()
    pushes = Pushes(bus, registry, PARTITIONS, "delivery-0")

    async def no_ping(_: Received) -> None:
        raise AssertionError("not a ping")

    handle = pushes.handler(no_ping)
    queue = ids.new_id()
    partition = ids.partition_of(queue, PARTITIONS)
    await registry.claim(partition, queue, 3, "c1", 1)
    first, second = Head(ids.new_id(), 1, "Ym9keQ"), Head(ids.new_id(), 2, "YWdhaW4")
    await handle(_event("subscribed", queue, 900, first, slot=3, conn="c1"))
    assert _pushes(bus) == [("MSG", "c1", first.msg_id, 3)]
    started = schemas.QueueEvent(event="writer_started", queue="", lsn=0)
    await handle(Received(topics.QUEUE_EVENTS, partition, 901, None, started))
    # The new writer answers the resync with the queue's head, at its own (lower) lsn.
    await handle(_event("subscribed", queue, 5, first, slot=3, conn="c1"))
    await handle(_event("changed", queue, 6, second))  # acked on the new writer: pushed
    assert _pushes(bus)[-1] == ("MSG", "c1", second.msg_id, 3)
    await pushes.close()
