"""A running queue-writer's queues and messages as of one command boundary (the cut), captured
while commands go on: the online export's consistent view (`POST /admin/export`).

How: at the cut the capture keeps the store log's queue view (an immutable snapshot by
reference: `StoreLog.queues`, the same one a dump takes) and the command positions; it then
reads each queue's messages from the journal in slices, letting commands run in between. A
command may change a queue not read yet: its owner calls `before_change(queue)` before
applying it, and the capture reads that queue first, as it stood at the cut (copy before
write). So the captured state is exactly the cut's, at the cost of one queue's read in the
path of the first command that touches it after the cut; nothing waits for the whole export.

Invariants:
- every queue of the cut's view is captured once, with its record as of the cut and its
  messages read before any change after the cut reached them (provided every change after
  the cut is announced by `before_change`: commands, re-syncs; the owner holds expiry sweeps
  off until `done`);
- queues created after the cut are not captured; a queue deleted after the cut is;
- only queues `served` selects are captured: a copy of a partition the instance holds without
  serving it (kept for a hand-off, `relay_queues.partition_state`) belongs to another owner's
  part of the export;
- reading a queue that was not open closes it again (`QueueJournal.messages(keep_open=False)`),
  so the export does not evict the busy queues;
- a read that fails in `before_change` fails the export (`step` raises it), never the command.

Not thread-safe: runs on the owner's event loop, like the journal it reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from relay_archive import export, tables
from relay_journal.journal import QueueJournal
from relay_storelog.records import QueueRecord
from relay_storelog.store import QueueView


@dataclass
class Captured:
    queues: list[dict[str, object]] = field(default_factory=list)
    messages: list[dict[str, object]] = field(default_factory=list)
    early: int = 0
    """Queues read ahead of the slices because a command was about to change them."""
    longest_ms: float = 0.0
    """The longest time commands waited for the capture: one slice, or one early read."""


class QueueCapture:
    def __init__(
        self,
        journal: QueueJournal,
        view: QueueView,
        cut: tables.Cut,
        served: Callable[[str], bool] = lambda _: True,
    ) -> None:
        """Take the cut now: `view` is the store log's queue view at this command boundary,
        `cut` the positions of that same boundary, `served` which queues this owner serves."""
        self.journal = journal
        self.view = view
        self.cut = cut
        self.served = served
        self.captured = Captured()
        self._done: set[str] = set()
        self._pending: Iterator[QueueRecord] = iter(view.values())
        self.finished = False
        self.failed: Exception | None = None
        """A read that failed in `before_change`: the capture stops (raised by `step`), and
        the command that announced it goes on (an export never fails a command)."""

    def _read(self, record: QueueRecord) -> None:
        queue = record.recipient_id
        self._done.add(queue)
        self.captured.queues.append(export.queue_row(record))
        messages = self.journal.messages(queue, keep_open=False)
        self.captured.messages.extend(export.message_rows(queue, messages))

    def before_change(self, queue: str | None) -> None:
        """Called before a change to `queue` is applied (None: the command names no queue)."""
        if self.finished or queue is None or queue in self._done or not self.served(queue):
            return
        record = self.view.get(queue)
        if record is None:
            return  # created after the cut
        started = time.perf_counter()
        try:
            self._read(record)
        except Exception as error:  # the journal's read errors: the export's, not the command's
            self.failed, self.finished = error, True
            return
        self.captured.early += 1
        self._waited(started)

    def step(self, queues: int) -> bool:
        """Read up to `queues` more queues of the cut; True once every one is captured.
        Raises what failed an earlier `before_change` read."""
        if self.failed is not None:
            raise self.failed
        started = time.perf_counter()
        try:
            for _ in range(queues):
                record = next(self._pending, None)
                if record is None:
                    self.finished = True
                    return True
                if record.recipient_id not in self._done and self.served(record.recipient_id):
                    self._read(record)
            return False
        finally:
            self._waited(started)

    def _waited(self, started: float) -> None:
        spent = (time.perf_counter() - started) * 1000
        self.captured.longest_ms = max(self.captured.longest_ms, spent)
