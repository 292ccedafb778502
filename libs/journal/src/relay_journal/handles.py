"""The journal's queue-file handles: one pool, bounded by the handles actually held.

An open queue (its state in memory) and its file handles are two things: a queue keeps its
state while its handles are closed, and takes one again when it next touches a file. A queue
whose read and write file are the same holds one handle for both (seed 000's common case: a
queue holds two files only between a rotation and the end of reading the older one), and
appends are buffered in memory between file writes (`relay_journal.queue`), so a written
queue needs its handle only once per 64 KiB of messages, at a read, or at a checkpoint.

Rejected: bounding open queues by two handles each (what the journal did first). With more
written queues than half the handle limit (10,000 under a limit of 20,000) the LRU closed
and reloaded a queue on nearly every write, a state line and four file operations each:
~11k durable writes/s against ~45k at 100 queues (issue 18).

Invariants:
- `held` counts the queue-file descriptors open, and after every `opened` it is at most
  `limit`: the least recently used queues' handles are closed first, never the handles of the
  queue that asked (a queue needs at most two, and `limit` is at least two);
- closing a queue's handles (`OpenQueue.release_files`) loses nothing: its buffered appends
  reach its file first, and its state stays in memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class HoldsFiles(Protocol):
    def release_files(self) -> None:
        """Write what is buffered for the file, then close every handle (calls `closed`)."""


class Handles:
    def __init__(self, limit: int) -> None:
        if limit < 2:
            raise ValueError("a queue may need two handles: the limit must be at least 2")
        self.limit = limit
        self.held = 0
        self.released = 0
        """Queues whose handles were closed to make room (a figure for tests and benchmarks)."""
        self._lru: OrderedDict[HoldsFiles, None] = OrderedDict()

    def opened(self, queue: HoldsFiles) -> None:
        """`queue` opened one handle: count it, and close other queues' past the limit."""
        self.held += 1
        lru = self._lru
        lru[queue] = None
        lru.move_to_end(queue)
        while self.held > self.limit:
            victim = next(iter(lru))
            if victim is queue:  # only the asking queue is left (limit >= 2 makes this rare)
                return
            victim.release_files()
            self.released += 1

    def touch(self, queue: HoldsFiles) -> None:
        """`queue` used a handle it holds: it is the most recently used."""
        self._lru.move_to_end(queue)

    def closed(self, queue: HoldsFiles, *, still_holds: bool) -> None:
        """`queue` closed one handle; `still_holds` if it has another open."""
        self.held -= 1
        if not still_holds:
            self._lru.pop(queue, None)
