"""The queue-writer's rules: one queue command in, one outcome out (API.md Queues, SMP rules).

Invariants:
- a refused command (bad signature, unknown queue, quota, suspended, wrong ACK) changes nothing
  but what the rules say it changes (the first refused send appends the quota marker);
- every outcome names what must be durable before it is answered (`lsn` in the journal, `seq`
  in the store log), and carries the event delivery must see, with the queue's current head;
  a SEND that leaves the head as it was, and an ACK that empties the queue, carry none
  (delivery would do nothing with them: `relay_queues.delivery`);
- recipient commands are refused with the same AUTH whether the queue is unknown or the
  signature is wrong (`relay_queues.auth.verify`);
- a SEND is stored once per identity (`relay_queues.idempotency`: its `Idempotency-Key`, else
  its msg_id, which a producer retry repeats): within the journal's window a second one is
  answered with the first one's msg_id and ts and changes nothing, across restarts (the
  identity is logged with the message, `relay_journal.keys`); the body of the second is not
  compared (API.md: the key names the send).

Synchronous and single-threaded, over the synchronous engines: the service applies commands one
after another on its event loop and waits for durability outside.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from relay_durable.outcome import Outcome
from relay_journal import errors as journal_errors
from relay_journal.journal import QueueJournal
from relay_journal.records import Message
from relay_queues import auth, idempotency, ids
from relay_queues.delivery import Head, Subscriber
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog

DEFAULT_TTL_S = 21 * 24 * 3600


@dataclass(frozen=True)
class Signed:
    """A recipient command's proof: the text the server built from the request, and the
    signature the client sent for it."""

    text: str
    signature: bytes


@dataclass(frozen=True)
class Event:
    kind: str
    """`changed`, `read`, `subscribed` or `deleted` (see `relay_queues.delivery.Deliveries`)."""
    queue: ids.QueueId
    lsn: ids.Lsn
    head: Head | None = None
    subscriber: Subscriber | None = None
    since: int = 0
    """`subscribed`: the SUB's order (`QueueRules.subscribe`)."""


@dataclass(frozen=True)
class QueueOutcome(Outcome):
    """An answer (`relay_durable.outcome.Outcome`), and what must happen before it is sent."""

    lsn: ids.Lsn | None = None
    """Journal lsn that must be durable before answering."""
    seq: ids.Seq | None = None
    """Store-log sequence that must be durable before answering."""
    events: list[Event] = field(default_factory=list)


refused = QueueOutcome.refused


AUTH_REFUSED = refused(401, "AUTH", "signature, timestamp or queue not accepted")


def head_of(message: Message | None) -> Head | None:
    if message is None:
        return None
    return Head(ids.b64u(message.msg_id), message.ts_ms, ids.b64u(message.body), message.quota)


class QueueRules:
    def __init__(
        self, journal: QueueJournal, store: StoreLog, *, default_ttl_s: int = DEFAULT_TTL_S
    ) -> None:
        self.journal = journal
        self.store = store
        self.default_ttl_s = default_ttl_s
        self._last_order = 0

    @property
    def quota(self) -> int:
        return self.journal.settings.max_queue_messages

    def _lsn(self) -> ids.Lsn:
        return ids.Lsn(self.journal.wal.written_lsn)

    def _recipient(self, queue: str, signed: Signed) -> QueueRecord | None:
        record = self.store.queues.get(queue)
        key = record.recipient_key if record is not None else None
        return record if auth.verify(key, signed.text, signed.signature) else None

    def _head(self, queue: str, now_ms: int) -> Head | None:
        return head_of(self.journal.peek(queue, now_ms=now_ms))

    def _event(
        self, kind: str, queue: ids.QueueId, now_ms: int, subscriber: Subscriber | None = None
    ) -> Event:
        """An event with the queue's head now; the head first, since peeking may log the
        expiry of messages before it, and the event's lsn must cover that."""
        head = self._head(queue, now_ms)
        return Event(kind, queue, self._lsn(), head, subscriber)

    # -- commands --------------------------------------------------------------------------

    def create(
        self, queue: ids.QueueId, sender: ids.SenderId, recipient_key: str, now_ms: int
    ) -> QueueOutcome:
        answer = {"recipient_id": queue, "sender_id": sender, "quota": self.quota}
        existing = self.store.queues.get(queue)
        if existing is not None:
            if (existing.sender_id, existing.recipient_key) == (sender, recipient_key):
                return QueueOutcome(201, answer)  # the same command again
            return refused(503, "UNAVAILABLE", "id collision; retry")
        if self.store.by_sender(sender) is not None:
            return refused(503, "UNAVAILABLE", "id collision; retry")
        record = QueueRecord(queue, sender, recipient_key, self.quota, now_ms, now_ms)
        return QueueOutcome(201, answer, seq=ids.Seq(self.store.new(record)))

    def send(
        self,
        sender: ids.SenderId,
        msg_id: str,
        body: bytes,
        ttl_s: int | None,
        now_ms: int,
        key: str | None = None,
    ) -> QueueOutcome:
        """Store a message, once per identity (`key`, the client's Idempotency-Key, else
        `msg_id`); a send already stored within the window is answered as it was, even if
        its queue has since been suspended."""
        send_key = idempotency.identity(sender, key, msg_id)  # ValueError: a malformed key
        record = self.store.by_sender(sender)
        if record is None:
            return refused(404, "NOT_FOUND", "unknown sender id")
        queue = ids.QueueId(record.recipient_id)
        first = self.journal.sent(send_key, now_ms)
        if first is not None:
            # Answered once the first is durable: it may be in this very fsync round.
            answer = {"msg_id": ids.b64u(first.msg_id), "ts": first.ts_ms}
            return QueueOutcome(201, answer, lsn=self._lsn())
        if record.status == "suspended":
            return refused(403, "FORBIDDEN", "queue suspended")
        ttl_ms = (ttl_s if ttl_s is not None else self.default_ttl_s) * 1000
        before = self.journal.peek(queue)  # the head delivery was told of (expired or not)
        try:
            self.journal.write(
                queue,
                ids.id_bytes(msg_id),
                body,
                ts_ms=now_ms,
                expires_ms=now_ms + ttl_ms,
                key=send_key,
            )
        except journal_errors.QuotaExceeded:
            # The first refusal appended the marker: it must be durable, and delivery told.
            event = self._event("changed", queue, now_ms)
            return QueueOutcome(
                429, code="QUOTA", detail="queue full", lsn=event.lsn, events=[event]
            )
        except journal_errors.QueueSuspended:
            return refused(403, "FORBIDDEN", "queue suspended")
        after = self.journal.peek(queue, now_ms=now_ms)  # drops expired heads (logged)
        lsn = self._lsn()  # covers the write and the expiries the peek logged
        stays = before is not None and after is not None and after.msg_id == before.msg_id
        # Behind a head that stays, delivery has nothing to do (decision 0013).
        events = [] if stays else [Event("changed", queue, lsn, head_of(after))]
        return QueueOutcome(201, {"msg_id": msg_id, "ts": now_ms}, lsn=lsn, events=events)

    def info(self, queue: ids.QueueId, signed: Signed) -> QueueOutcome:
        record = self._recipient(queue, signed)
        if record is None:
            return AUTH_REFUSED
        return QueueOutcome(
            200,
            {
                "size": self.journal.size(queue),
                "quota": record.quota,
                "status": record.status,
                "created_at": record.created_at,
            },
        )

    def head(self, queue: ids.QueueId, signed: Signed, now_ms: int) -> QueueOutcome:
        """The head message, handed out until ACK (delivery is told)."""
        if self._recipient(queue, signed) is None:
            return AUTH_REFUSED
        event = self._event("read", queue, now_ms)
        # Expired heads dropped by the peek are logged: durable before answering.
        return _message_outcome(event)

    def ack(self, queue: ids.QueueId, msg_id: str, signed: Signed, now_ms: int) -> QueueOutcome:
        """Acknowledge the head; answers the next message. The head handed out may have expired
        since: its ACK is still accepted (the client has it); expired ones after it are dropped."""
        if self._recipient(queue, signed) is None:
            return AUTH_REFUSED
        current = self.journal.peek(queue)
        # Constant time: the answer must not tell how much of a guessed msg_id was right.
        if current is None or not hmac.compare_digest(
            ids.b64u(current.msg_id).encode(), msg_id.encode()
        ):
            return refused(404, "NO_MSG", "msg_id is not the message in flight")
        self.journal.ack(queue, current.msg_id)
        outcome = _message_outcome(self._event("changed", queue, now_ms))
        # Emptied: delivery learns it from the next head, which differs (decision 0013).
        return outcome if outcome.data is not None else replace(outcome, events=[])

    def suspend(self, queue: ids.QueueId, signed: Signed, now_ms: int) -> QueueOutcome:
        record = self._recipient(queue, signed)
        if record is None:
            return AUTH_REFUSED
        lsn = ids.Lsn(self.journal.suspend(queue))
        seq = None
        if record.status != "suspended":
            seq = ids.Seq(self.store.set_status(queue, "suspended", now_ms))
        return QueueOutcome(200, {}, lsn=lsn, seq=seq)

    def delete(self, queue: ids.QueueId, signed: Signed) -> QueueOutcome:
        if self._recipient(queue, signed) is None:
            return AUTH_REFUSED
        lsn = ids.Lsn(self.journal.delete(queue))
        seq = ids.Seq(self.store.delete(queue))
        return QueueOutcome(204, lsn=lsn, seq=seq, events=[Event("deleted", queue, lsn)])

    def _order(self, now_ms: int) -> int:
        """A SUB's order: microseconds of the clock, moved on by one past the last order
        given, so two SUBs of a queue always compare the way this writer applied them. The
        clock carries it across restarts (a count would start again at 0), and a broker that
        lost its log keeps it too (command offsets would start again)."""
        self._last_order = max(self._last_order + 1, now_ms * 1000)
        return self._last_order

    def subscribe(
        self, queue: ids.QueueId, signed: Signed, subscriber: Subscriber, now_ms: int
    ) -> QueueOutcome:
        """An accepted SUB: answered with its order (`since`), which the ingress records in
        the registry and delivery compares (`relay_queues.delivery`)."""
        if self._recipient(queue, signed) is None:
            return AUTH_REFUSED
        since = self._order(now_ms)
        outcome = self.resync(queue, subscriber, now_ms, since)
        return QueueOutcome(200, {"since": since}, lsn=outcome.lsn, events=outcome.events)

    def resync(
        self, queue: ids.QueueId, subscriber: Subscriber, now_ms: int, since: int = 0
    ) -> QueueOutcome:
        """Tell delivery the queue's head for `subscriber` (internal: after a SUB, or when
        delivery rebuilds its state, with the SUB's order the registry holds); nothing for a
        queue that no longer exists."""
        if queue not in self.store.queues:
            return QueueOutcome(200, {})
        head = self._head(queue, now_ms)
        event = Event("subscribed", queue, self._lsn(), head, subscriber, since)
        return QueueOutcome(200, {}, lsn=event.lsn, events=[event])

    def expire(self, now_ms: int, keep: Callable[[str], bool] | None = None) -> Iterator[Event]:
        """Drop expired messages from every queue (those `keep` accepts, if given: the queues
        of the partitions served), open or not (the periodic sweep), lazily; one event per
        queue that lost messages."""
        for queue, _ in self.journal.expire_all(now_ms, keep):
            yield self._event("changed", ids.QueueId(queue), now_ms)


def _message_outcome(event: Event) -> QueueOutcome:
    """200 with the head message, or 204 when the queue is empty."""
    head = event.head
    return QueueOutcome(
        200 if head else 204, head.frame() if head else None, lsn=event.lsn, events=[event]
    )
