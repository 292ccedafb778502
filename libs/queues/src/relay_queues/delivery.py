"""Delivery's per-queue state: who is subscribed, and which head message is handed out.

Invariants (BRIEF §4, Delivery):
- a queue's head is handed out (pushed to its subscriber, or read over REST) at most once until
  the queue-writer reports another head (after an ACK, an expiry or a delete); it is handed out
  again, with the same msg_id, only to a newer subscriber (takeover, resync), never twice to the
  same one, and an acknowledged message is never the head again;
- a push goes only to the current subscriber; a takeover sends END to the previous one;
- events apply in the queue-writer's order: an event with an lsn older than one already applied
  to the queue is ignored (records may be reordered by a producer retry);
- only queues with a subscriber or a handed-out head are kept in memory.

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
        if state.subscriber is None and state.handed is None:
            del self._queues[queue]
        return pushes

    def subscribed(
        self, queue: str, lsn: int, head: Head | None, subscriber: Subscriber
    ) -> list[Push]:
        """A SUB was accepted (or a subscription is resynced after a restart): the head goes to
        `subscriber`, even if it was handed out before; a previous subscriber gets END."""
        state = self._current(queue, lsn)
        if state is None:
            return []
        pushes = []
        if state.subscriber is not None and state.subscriber != subscriber:
            pushes.append(Push(state.subscriber, Frame.END, queue))
        state.subscriber = subscriber
        state.handed = None
        return pushes + self._settle(queue, state, head)

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
            state.subscriber = None
            if state.handed is None:
                del self._queues[queue]

    def forget(self, which: Callable[[str], bool]) -> None:
        """Drop the queues `which` selects (their partitions were revoked, or are resynced)."""
        for queue in [q for q in self._queues if which(q)]:
            del self._queues[queue]
