"""The queue-writer's command handler: each queue command applied by `relay_queues.writer`,
its answer and events handed to the outbox.

Invariants:
- commands of a partition are applied one after another, in offset order, on the event loop;
  the handler returns as soon as a command is applied (the outbox waits for durability), so
  one fsync round covers every command applied meanwhile;
- a command past its deadline is dropped unapplied: its asker has already answered 503;
- idempotence (BRIEF §4): before a command is applied, its position (`<broker epoch>:<next
  offset>`) is marked in the journal's log, in order with the changes, so no change is durable
  without it; after a restart each partition is read from its mark, and a record before the
  mark (consumed twice) is skipped. A broker that lost its log (a new epoch) is read from 0;
- a SEND put on Kafka twice (a producer retry), even across a restart, or sent again with the
  same `Idempotency-Key`, is stored once: `QueueRules.send` checks its identity against the
  journal's send keys;
- the expiry sweep touches only the queues of the partitions served (`served`);
- every queue a command, a re-sync or the sweep changes is reported to the hand-off's watches
  (`watches`) before anything else runs;
- malformed fields get BAD_REQUEST and change nothing (the ingress validates first; this is the
  second line).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

import structlog

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_queue_writer.outbox import Outbox, Send
from relay_queue_writer.stores import Stores
from relay_queues import ids
from relay_queues.delivery import Subscriber
from relay_queues.partition_watch import Watches
from relay_queues.writer import Event, QueueOutcome, QueueRules, Signed, refused

log = structlog.get_logger(__name__)

SWEEP_SLICE = 256
"""Queues expired between two yields to the event loop."""


def now_ms() -> int:
    return int(time.time() * 1000)


class Commands:
    """Built with the app; `open()` once the stores are open, `close()` before they close."""

    def __init__(self, bus: Bus, stores: Stores, partitions: int, expire_interval_s: float) -> None:
        self.bus = bus
        self.stores = stores
        self.partitions = partitions
        self.expire_interval_s = expire_interval_s
        self._rules: QueueRules | None = None
        self._next: dict[int, int] = {}
        """Partition → the offset after the last command applied (for `bus.epoch`)."""
        self._outbox: Outbox | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.served: Callable[[], Collection[int]] = lambda: range(partitions)
        """The partitions served now (the app sets the ownership's): the sweep expires only
        their queues, so a partition's copy kept for a hand-off (a source after its fence, a
        target after an import) changes only through the hand-off."""
        self.watches = Watches(partitions)
        """The hand-off's watches (`relay_queues.partition_watch`): told every queue a command,
        a re-sync or the sweep changes."""
        self.before_change: Callable[[str | None], None] | None = None
        """Called with the queue a command or re-sync is about to change (an online export's
        copy before write, `relay_archive.capture`); None when nobody watches."""
        self.sweep_lock = asyncio.Lock()
        """Held by an expiry sweep, and by an online export while it reads (no sweep then)."""

    async def open(self) -> None:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        self._rules = QueueRules(journal.journal, store.store)
        self._outbox = Outbox(self.bus, journal, store)
        self._sweeper = asyncio.create_task(self._sweep_every(), name="expiry-sweep")

    @property
    def rules(self) -> QueueRules:
        assert self._rules is not None, "not open"
        return self._rules

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None, "not open"
        return self._outbox

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._outbox is not None:
            await self._outbox.close()

    def _event(self, event: Event) -> Send:
        record = schemas.QueueEvent(
            event=event.kind,
            queue=event.queue,
            lsn=event.lsn,
            head=event.head,
            slot=event.subscriber.slot if event.subscriber else None,
            conn=event.subscriber.conn if event.subscriber else "",
            since=event.since,
        )
        return Send(topics.QUEUE_EVENTS, record, ids.partition_of(event.queue, self.partitions))

    def _apply(self, command: schemas.QueueCommand, now: int) -> QueueOutcome:
        rules = self.rules
        if isinstance(command, schemas.CreateQueue):
            queue, sender = ids.QueueId(command.queue), ids.SenderId(command.sender)
            return rules.create(queue, sender, command.recipient_key, now)
        if isinstance(command, schemas.SendMessage):
            sender, body = ids.SenderId(command.sender), ids.unb64u(command.body)
            return rules.send(sender, command.msg_id, body, command.ttl_s, now, command.key)
        queue = ids.QueueId(command.queue)
        signed = Signed(command.signed, ids.unb64u(command.sig))
        match command:
            case schemas.ReadInfo():
                outcome = rules.info(queue, signed)
            case schemas.ReadHead():
                outcome = rules.head(queue, signed, now)
            case schemas.AckMessage():
                outcome = rules.ack(queue, command.msg_id, signed, now)
            case schemas.SuspendQueue():
                outcome = rules.suspend(queue, signed, now)
            case schemas.DeleteQueue():
                outcome = rules.delete(queue, signed)
            case schemas.SubscribeQueue():
                outcome = rules.subscribe(
                    queue, signed, Subscriber(command.slot, command.conn), now
                )
        return outcome

    def positions(self) -> dict[int, int]:
        """Partition → the offset after the last command applied, for every assigned
        partition: the cut of the state as it stands between two commands."""
        return dict(self._next)

    def _queue_of(self, record: schemas.QueueCommand | schemas.QueueResync) -> str | None:
        if isinstance(record, schemas.SendMessage):
            found = self.rules.store.by_sender(record.sender)
            return None if found is None else found.recipient_id
        return record.queue

    def _mark_key(self, partition: int) -> str:
        return f"p{partition}"

    async def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Where to read each partition: after its last applied command, or from 0 when the
        broker's log is not the one the marks are for."""
        marks = self.rules.journal.marks
        offsets = {}
        self._next = {}  # every assigned partition is sought again: a dropped one leaves the cut
        for partition in partitions:
            epoch, _, offset = marks.get(self._mark_key(partition), "").partition(":")
            offsets[partition] = int(offset) if epoch == self.bus.epoch and offset else 0
            self._next[partition] = offsets[partition]
        log.info("commands_resumed", epoch=self.bus.epoch, offsets=offsets)
        return offsets

    def _first_time(self, received: Received) -> bool:
        """Mark the record as applied; False if it already was (consumed twice)."""
        if received.offset < self._next.get(received.partition, 0):
            return False
        self._next[received.partition] = received.offset + 1
        self.rules.journal.mark(
            self._mark_key(received.partition), f"{self.bus.epoch}:{received.offset + 1}"
        )
        return True

    async def handle(self, received: Received) -> None:
        if not self._first_time(received):
            return
        record = received.record
        if (self.watches or self.before_change is not None) and isinstance(
            record, schemas.QueueCommand | schemas.QueueResync
        ):
            queue = self._queue_of(record)
            self.watches.changed(queue)
            if self.before_change is not None:
                self.before_change(queue)
        if isinstance(record, schemas.QueueResync):
            outcome = self.rules.resync(
                ids.QueueId(record.queue),
                Subscriber(record.slot, record.conn),
                now_ms(),
                record.since,
            )
            self.outbox.put(outcome.lsn, None, [self._event(e) for e in outcome.events])
            return
        if not isinstance(record, schemas.QueueCommand) or record.expired():
            return
        try:
            outcome = self._apply(record, now_ms())
        except ValueError as error:  # includes InvalidId and malformed base64
            outcome = refused(400, "BAD_REQUEST", str(error))
        reply = schemas.QueueReply(
            id=record.id,
            origin=record.origin,
            status=outcome.status,
            data=outcome.data,
            code=outcome.code,
            detail=outcome.detail,
        )
        sends = [self._event(e) for e in outcome.events]
        sends.append(Send(topics.INGRESS_INBOX, reply, record.reply_slot))
        self.outbox.put(outcome.lsn, outcome.seq, sends)

    async def sweep(self) -> int:
        """Drop expired messages from every queue, letting commands run between queues;
        returns how many queues lost messages."""
        changed = 0
        served = set(self.served())

        def keep(queue: str) -> bool:
            return ids.partition_of(queue, self.partitions) in served

        async with self.sweep_lock:
            for event in self.rules.expire(now_ms(), keep):
                self.watches.changed(event.queue)  # before anything else runs
                self.outbox.put(event.lsn, None, [self._event(event)])
                changed += 1
                if changed % SWEEP_SLICE == 0:
                    await asyncio.sleep(0)
        log.info("queues_swept", changed=changed)
        return changed

    async def _sweep_every(self) -> None:
        while True:
            await asyncio.sleep(self.expire_interval_s)
            await self.sweep()
