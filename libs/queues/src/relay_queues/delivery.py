"""Delivery's per-queue state: who is subscribed, and which head message is handed out.

Invariants (BRIEF §4, Delivery):
- a queue's head is handed out (pushed to its subscriber, or read over REST) at most once until
  the queue-writer reports another head (after an ACK, an expiry or a delete); it is handed out
  again, with the same msg_id, only to a newer subscriber (takeover, resync), never twice to the
  same one, and an acknowledged message is never the head again;
- a push goes only to the current subscriber; a takeover sends END to the previous one;
- subscriptions compare by their SUB's order at the queue-writer (`since`), not by when their
  event arrives: an older one (a resync of what the registry held, an ingress's late notice)
  never takes a queue from a newer one, and gets END instead; the same subscription told again
  (a resync after a queue-writer restart) gets only a head it does not have yet;
- events apply in the queue-writer's order: an event with an lsn older than one already applied
  to the queue is ignored (records may be reordered by a producer retry); a new writer of a
  partition counts in its own journal, so its start restarts that order (`new_writer`) and
  keeps the rest (who is subscribed, which head is handed out);
- only queues with a subscriber are kept in memory: without one, which head is out matters to
  nobody (a new subscriber gets the head whoever has it), so the queue-writer need not tell
  delivery that an ACK emptied a queue (decision 0013); the next head it reports differs from
  the one handed out.

Pure logic: the delivery service feeds it the queue-writer's events and sends what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from relay_queues import ids


@dataclass(frozen=True)
class Subscriber:
    slot: ids.Slot
    """The inbox partition of the ingress instance holding the connection."""
    conn: ids.ConnId
    """The connection's id at that instance."""


@dataclass(frozen=True)
class Head:
    msg_id: str
    ts: int
    body: str = ""
    """b64u; empty for the quota marker."""
    quota: bool = False

    def frame(self) -> dict[str, object]:
        """The message as API.md shows it."""
        if self.quota:
            return {"msg_id": self.msg_id, "ts": self.ts, "quota": True}
        return {"msg_id": self.msg_id, "ts": self.ts, "body": self.body}


def acked_already(head: Head, last_acked: str | None) -> bool:
    """A push of the message this connection has just acknowledged: delivery sent it before the
    ACK's event reached it. The ingress drops it; the next push brings the next message."""
    return head.msg_id == last_acked


def confirm_notice(
    queue: str, subscriber: Subscriber, since: int, listed: Subscriber | None, listed_since: int
) -> tuple[list[Push], int | None]:
    """A `registered` notice of a SUB this instance never saw (`Deliveries.registered`), checked
    against what the registry lists for the queue now (`listed`, None when nothing): the
    pushes, and the order to resync the subscriber with (None: no resync). The registry names
    it: resync. It names a later SUB: the notice is old (read again after a restart), END. It
    names nothing: the subscriber left since, nothing."""
    if listed is None:
        return [], None
    if listed == subscriber:
        return [], max(since, listed_since)
    if listed_since > since:
        return [Push(subscriber, Frame.END, queue)], None
    return [], None


class Frame(Enum):
    MSG = "MSG"
    END = "END"


@dataclass(frozen=True)
class Push:
    to: Subscriber
    frame: Frame
    queue: str
    head: Head | None = None


@dataclass
class _Queue:
    subscriber: Subscriber | None = None
    handed: str | None = None
    """msg_id of the head handed out and not yet acknowledged."""
    lsn: int = -1
    since: int = 0
    """The subscriber's SUB order (0: unknown, e.g. from a queue-writer that gives none)."""


class Deliveries:
    def __init__(self) -> None:
        self._queues: dict[str, _Queue] = {}

    def __len__(self) -> int:
        return len(self._queues)

    def subscriber(self, queue: str) -> Subscriber | None:
        state = self._queues.get(queue)
        return state.subscriber if state else None

    def _current(self, queue: str, lsn: int) -> _Queue | None:
        """The queue's state if an event at `lsn` is not stale, else None."""
        state = self._queues.setdefault(queue, _Queue())
        if lsn < state.lsn:
            return None
        state.lsn = lsn
        return state

    def _settle(self, queue: str, state: _Queue, head: Head | None) -> list[Push]:
        if head is None or head.msg_id != state.handed:
            state.handed = None
        pushes = []
        if state.subscriber is not None and state.handed is None and head is not None:
            state.handed = head.msg_id
            pushes.append(Push(state.subscriber, Frame.MSG, queue, head))
        if state.subscriber is None:
            del self._queues[queue]
        return pushes

    def subscribed(
        self, queue: str, lsn: int, head: Head | None, subscriber: Subscriber, since: int = 0
    ) -> list[Push]:
        """A SUB was accepted (or a subscription is resynced after a restart): the head goes to
        `subscriber`, even if it was handed out before; a previous subscriber gets END. A SUB
        older than the one in force (`since`) takes nothing over: it gets END; the subscription
        in force told again is settled as a change (nothing handed out twice)."""
        state = self._current(queue, lsn)
        if state is None:
            return []
        current = state.subscriber
        if current is not None and (
            since < state.since or (current == subscriber and since == state.since)
        ):
            if current == subscriber:
                return self._settle(queue, state, head)
            return [Push(subscriber, Frame.END, queue)]
        pushes = []
        if current is not None and current != subscriber:
            pushes.append(Push(current, Frame.END, queue))
        state.subscriber = subscriber
        state.since = since
        state.handed = None
        return pushes + self._settle(queue, state, head)

    def registered(self, queue: str, subscriber: Subscriber, since: int) -> tuple[list[Push], bool]:
        """An ingress recorded `subscriber`'s accepted SUB (order `since`) in the registry,
        after its `subscribed` event was sent. Returns the pushes, and whether this instance
        must resync the subscription: it took the partition over between that event and the
        registry write, so it saw neither (issue 18)."""
        state = self._queues.get(queue)
        current = state.subscriber if state is not None else None
        if state is None or current is None:
            return [], True
        if current == subscriber and state.since >= since:
            return [], False  # known already
        if state.since > since:
            return [Push(subscriber, Frame.END, queue)], False  # taken over since
        return [], True

    def changed(self, queue: str, lsn: int, head: Head | None) -> list[Push]:
        """The queue's head may have changed (a write, an ACK, an expiry)."""
        state = self._current(queue, lsn)
        return [] if state is None else self._settle(queue, state, head)

    def read(self, queue: str, lsn: int, head: Head | None) -> list[Push]:
        """The head was read over REST: it is handed out, so the subscriber waits for its ACK."""
        state = self._current(queue, lsn)
        if state is None:
            return []
        if head is not None:
            state.handed = head.msg_id
        return self._settle(queue, state, head)

    def deleted(self, queue: str, lsn: int) -> list[Push]:
        state = self._current(queue, lsn)
        if state is None:
            return []
        del self._queues[queue]
        return [] if state.subscriber is None else [Push(state.subscriber, Frame.END, queue)]

    def unsubscribed(self, queue: str, subscriber: Subscriber) -> None:
        """The subscriber's connection closed (sent by its ingress, outside the lsn order:
        it only ends the subscription it names)."""
        state = self._queues.get(queue)
        if state is not None and state.subscriber == subscriber:
            del self._queues[queue]

    def new_writer(self, which: Callable[[str], bool]) -> None:
        """A queue-writer started on the queues `which` selects: their events' lsns are its
        journal's from now on, not comparable with the previous writer's."""
        for queue, state in self._queues.items():
            if which(queue):
                state.lsn = -1

    def forget(self, which: Callable[[str], bool]) -> None:
        """Drop the queues `which` selects (their partitions were revoked, or are resynced)."""
        for queue in [q for q in self._queues if which(q)]:
            del self._queues[queue]
