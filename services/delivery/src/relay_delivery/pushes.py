"""Delivery's event loop: the queue-writers' events in, MSG and END out to the ingress
instance holding each subscriber's connection (`relay_queues.delivery` decides what).

Invariants:
- on taking a partition over (start, rebalance, a broker that lost its log) this instance
  reads from the partition's end offset at that moment on: older events describe a past it no longer
  knows, and the current state comes instead from a resync of every subscription Redis lists
  for the partition (the queue-writer answers each with the queue's head);
- pushes leave in the order events were handled (`Bus.post`); a lost push is repaired by the
  next resync or SUB, and the same msg_id is sent again then (at least once);
- a takeover also sends END to each subscriber the registry says was taken over (`previous`):
  the instance that saw the takeover may have died before sending it;
- a subscription whose `subscribed` event this instance did not see (it took the partition over
  between that event and the ingress's registry write) is resynced when the ingress's
  `registered` notice arrives, if the registry still names it (a notice read again after a
  restart may be of a subscriber taken over since: that one gets END, not the queue);
- when a queue-writer says it started on a partition (`writer_started`: the events it had made
  durable but not sent died with its predecessor), the lsn order of the partition's queues
  starts again (the new writer's lsns are its own journal's, which may count lower after a
  partition moved to it; who is subscribed and which head is out are kept) and every
  subscription the registry lists for the partition is resynced, so a head that changed
  meanwhile reaches its subscriber.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog
from redis.exceptions import RedisError

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Handler, Received
from relay_queues import ids
from relay_queues.delivery import Deliveries, Frame, Push, Subscriber, confirm_notice
from relay_routes.subscriptions import Subscriptions

log = structlog.get_logger(__name__)

RESYNC_RETRY_S = 1.0


class Pushes:
    def __init__(
        self, bus: Bus, subscriptions: Subscriptions, partitions: int, instance: str
    ) -> None:
        self.bus = bus
        self.subscriptions = subscriptions
        self.partitions = partitions
        self.instance = instance
        self.deliveries = Deliveries()
        self._resyncs: set[asyncio.Task[None]] = set()

    async def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        offsets = await self.bus.end_offsets(topics.QUEUE_EVENTS, partitions)
        taken = set(partitions)
        self.deliveries.forget(lambda q: ids.partition_of(q, self.partitions) in taken)
        self._start_resync(partitions, end_previous=True)
        log.info("partitions_taken_over", partitions=partitions, offsets=offsets)
        return offsets

    def _start_resync(self, partitions: list[int], *, end_previous: bool) -> None:
        self._start(self._resync(partitions, end_previous), "resync")

    def _start(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._resyncs.add(task)
        task.add_done_callback(self._resyncs.discard)

    async def _confirm(self, queue: str, subscriber: Subscriber, since: int) -> None:
        """A notice of a SUB this instance has not seen: resync it if the registry names it
        still, END it if the registry names a later subscriber, nothing if it is gone."""
        partition = ids.partition_of(queue, self.partitions)
        while True:
            try:
                entry = await self.subscriptions.of_queue(partition, queue)
                break
            except (RedisError, OSError) as error:
                log.warning("resync_waiting_for_redis", error=str(error))
                await asyncio.sleep(RESYNC_RETRY_S)
        listed = None if entry is None else Subscriber(ids.Slot(entry.slot), ids.ConnId(entry.conn))
        pushes, resync = confirm_notice(
            queue, subscriber, since, listed, entry.since if entry else 0
        )
        for push in pushes:
            self._push(push)
        if resync is not None:
            self._ask_resync(queue, subscriber, resync)

    async def _resync(self, partitions: list[int], end_previous: bool) -> None:
        pending = list(partitions)
        while pending:
            partition = pending[0]
            try:
                listed = await self.subscriptions.of_partition(partition)
            except (RedisError, OSError) as error:
                log.warning("resync_waiting_for_redis", error=str(error))
                await asyncio.sleep(RESYNC_RETRY_S)
                continue
            ended = 0
            for queue, entry in listed.items():
                self._ask_resync(
                    queue, Subscriber(ids.Slot(entry.slot), ids.ConnId(entry.conn)), entry.since
                )
                previous = entry.previous
                if end_previous and previous is not None and previous != (entry.slot, entry.conn):
                    slot, conn = previous
                    self._push(Push(Subscriber(ids.Slot(slot), ids.ConnId(conn)), Frame.END, queue))
                    ended += 1
            log.info("resynced", partition=partition, subscriptions=len(listed), ended=ended)
            pending.pop(0)

    def _ask_resync(self, queue: str, subscriber: Subscriber, since: int) -> None:
        """Ask the queue's writer for its head, to be settled as `subscriber`'s SUB `since`."""
        resync = schemas.QueueResync(
            queue=queue, slot=subscriber.slot, conn=subscriber.conn, since=since
        )
        partition = ids.partition_of(queue, self.partitions)
        self.bus.post(topics.QUEUE_COMMANDS, resync, partition=partition)

    async def revoked(self, partitions: list[int]) -> None:
        gone = set(partitions)
        self.deliveries.forget(lambda q: ids.partition_of(q, self.partitions) in gone)

    def _push(self, push: Push) -> None:
        record = schemas.Deliver(
            frame=push.frame.value,
            conn=push.to.conn,
            queue=push.queue,
            head=push.head,
        )
        self.bus.post(topics.INGRESS_INBOX, record, partition=push.to.slot)

    def handle_event(self, event: schemas.QueueEvent, partition: int) -> None:
        d, queue, lsn = self.deliveries, event.queue, event.lsn
        subscriber = Subscriber(event.slot, event.conn) if event.slot is not None else None
        pushes: list[Push]
        match event.event:
            case "writer_started":
                log.info("queue_writer_started", partition=partition)
                # Its lsns are its own journal's: a writer that took the partition over from
                # another (a move) may count lower, and its events would read as stale.
                d.new_writer(lambda q: ids.partition_of(q, self.partitions) == partition)
                self._start_resync([partition], end_previous=False)
                pushes = []
            case "registered" if subscriber is not None:
                pushes, missed = d.registered(queue, subscriber, event.since)
                if missed:
                    self._start(self._confirm(queue, subscriber, event.since), "confirm")
            case "changed":
                pushes = d.changed(queue, lsn, event.head)
            case "read":
                pushes = d.read(queue, lsn, event.head)
            case "deleted":
                pushes = d.deleted(queue, lsn)
            case "subscribed" if subscriber is not None:
                pushes = d.subscribed(queue, lsn, event.head, subscriber, event.since)
            case "unsubscribed" if subscriber is not None:
                d.unsubscribed(queue, subscriber)
                pushes = []
            case _:
                log.warning("event_ignored", event=event.event, queue=queue)
                pushes = []
        for push in pushes:
            self._push(push)

    def handler(self, forward: Handler) -> Handler:
        async def handle(received: Received) -> None:
            record = received.record
            if isinstance(record, schemas.QueueEvent):
                self.handle_event(record, received.partition)
            elif isinstance(record, schemas.Ping):
                await forward(received)

        return handle

    async def close(self) -> None:
        for task in self._resyncs:
            task.cancel()
        await asyncio.gather(*self._resyncs, return_exceptions=True)
