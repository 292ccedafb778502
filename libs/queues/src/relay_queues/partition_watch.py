"""Which queues of a partition changed since its state was last taken whole (decision 0021), so
that a hand-off's catch-up carries only those queues and a partition's digest is had without
collecting every queue again.

A watch starts when a partition's state is collected whole (a source's export, the prefetch)
or installed whole (a target's import), and holds each queue's digest and message count as
collected from the engines. From then on the owner of the engines reports every queue a
command, a re-sync or an expiry sweep is about to change (`Watches.changed`), and a hand-off
install refreshes what the watch holds of the queues it wrote.

Invariants:
- `changed` holds every queue whose state may differ from what `held` says of it (its owner
  reports a queue before changing it, or, for a sweep, before anything else can run);
- `now` (`held` with every changed queue collected again) gives the same per-queue digests as a
  whole collection, so `digest` equals `partition_state.digest(collect(...))` (tested);
- a watch is named by a random token: a catch-up asks for the changes since the token of the
  export it prefetched, and a token this instance no longer holds (it restarted, or took the
  partition whole again) gets the whole state.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from relay_journal.journal import QueueJournal
from relay_queues import ids
from relay_queues import partition_state as ps
from relay_storelog.store import StoreLog


@dataclass(frozen=True)
class Held:
    digest: bytes
    messages: int

    @staticmethod
    def of(queue: ps.QueueState) -> Held:
        return Held(ps.queue_digest(queue), len(queue.messages))


@dataclass
class Now:
    """A watched partition as the engines hold it now."""

    held: dict[str, Held]
    changed: list[ps.QueueState]
    """The states of the changed queues still held."""
    gone: list[str]
    """The changed queues no longer held."""


@dataclass
class Watch:
    partition: int
    partitions: int
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    held: dict[str, Held] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)

    def now(self, journal: QueueJournal, store: StoreLog) -> Now:
        """`held` with the changed queues collected again (their states too, for a catch-up)."""
        held = dict(self.held)
        states, gone = [], []
        for queue_id in sorted(self.changed):
            state = ps.collect_queue(journal, store, queue_id)
            if state is None:
                held.pop(queue_id, None)
                gone.append(queue_id)
            else:
                held[queue_id] = Held.of(state)
                states.append(state)
        return Now(held, states, gone)

    def refresh(self, journal: QueueJournal, store: StoreLog) -> None:
        """Take the changed queues into `held` (a target, after installing changes: the token
        stays the state's it was installed over, so the same changes can be installed again)."""
        self.held = self.now(journal, store).held
        self.changed.clear()

    def summary(self, journal: QueueJournal, store: StoreLog) -> dict[str, Any]:
        """`partition_state.summary` of the partition, from the watch."""
        held = self.now(journal, store).held
        mark = self._mark(journal)
        return {
            "partition": self.partition,
            "mark": mark,
            "digest": self._digest(mark, held),
            "queues": len(held),
            "messages": sum(h.messages for h in held.values()),
        }

    def changes(self, journal: QueueJournal, store: StoreLog) -> ps.Changes:
        """The queues changed since the watch's whole state, and the whole digest now."""
        now = self.now(journal, store)
        mark = self._mark(journal)
        return ps.Changes(
            self.partition,
            self.partitions,
            self.token,
            mark,
            tuple(now.changed),
            tuple(now.gone),
            self._digest(mark, now.held),
        )

    def _mark(self, journal: QueueJournal) -> str:
        return journal.marks.get(ps.mark_key(self.partition), "")

    def _digest(self, mark: str, held: dict[str, Held]) -> str:
        return ps.whole_digest(
            self.partition, self.partitions, mark, (h.digest for h in held.values())
        )


class Watches:
    """The watches of one instance, at most one per partition."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._watches: dict[int, Watch] = {}

    def __bool__(self) -> bool:
        return bool(self._watches)

    def start(self, partition: int, token: str | None = None) -> Watch:
        """A new watch of `partition` holding nothing yet (its starter fills `held`), replacing
        any; `token` names it (an imported state's), a fresh one otherwise."""
        watch = Watch(partition, self.partitions)
        if token is not None:
            watch.token = token
        self._watches[partition] = watch
        return watch

    def get(self, partition: int) -> Watch | None:
        return self._watches.get(partition)

    def stop(self, partition: int) -> None:
        self._watches.pop(partition, None)

    def changed(self, queue_id: str | None) -> None:
        """`queue_id` is about to change (None: no queue, as a SEND to an unknown sender)."""
        if queue_id is None or not self._watches:
            return
        watch = self._watches.get(ids.partition_of(queue_id, self.partitions))
        if watch is not None:
            watch.changed.add(queue_id)
