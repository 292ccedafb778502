"""The queue journal: every queue's files behind one group-committed write-ahead log.

Invariants:
- every change is logged (`os.write` to the WAL) before the queue's files change, and with the
  `always` policy a change is acknowledged only after the WAL is fdatasync'ed up to it;
- opening reads only the WAL since the last checkpoint (it never scans the queue folders) and
  applies nothing yet: a queue's records are applied all at once when it is first used, the
  rest by `catch_up` (at once unless opened `lazy`; a lazy open is ready after one read of the
  log, however many queues it touches, issue 18). So a queue the replay empties is dropped
  only after its last record (a DROP sorts after every record of the older generation), and
  the opening checkpoint, which retires the old segments, waits for the last queue (every
  checkpoint first applies what is left);
- only open queues cost memory, and only queues touching their files hold handles; beyond
  `max_open_queues` the least recently used queues are closed (a closed empty active queue
  leaves no files), and beyond the handles the process may hold (its RLIMIT_NOFILE less
  `HANDLES_KEPT_FREE`, or `max_open_files`) the least recently used handles are closed while
  their queues stay open (`relay_journal.handles`);
- refused operations (quota, suspended, wrong ack, bad id) change nothing;
- a checkpoint gathers one tail table (`relay_journal.tail`: the state and buffered appends of
  every queue whose queue.log is behind; a queue writes its own line when it closes) and starts
  a new WAL segment; then it writes the table, flushes the filesystem (syncfs) and puts the
  table in force (on the checkpoint thread when a full segment began it, while changes go on
  into the new segment), and only after that logs its record and deletes the old segments;
- marks (`mark`) are logged in order with the changes and carried by every checkpoint: after a
  crash, `marks` holds each key's last value whose record is durable with a record after it
  (a SIGKILL can cut a write between a MARK and its change), so a caller that marks what it is
  about to apply before applying it never applies it twice, nor skips it;
- a write given a send key logs the key in the message's own record, and `sent` answers it
  with the first message's id and timestamp for `send_key_window_s`, across restarts
  (`relay_journal.keys`).

Not thread-safe: call it from one thread (the service's event loop); only `Wal.sync_to` may run
on another thread (see `relay_journal.aio`).
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

from relay_durable.appendlog import fsync_dir
from relay_journal import errors, keys, layout, records, tail
from relay_journal.handles import Handles
from relay_journal.queue import OpenQueue, new_file_id, read_state_file, span_bytes
from relay_journal.records import (
    FLAG_QUOTA,
    MAX_BODY_BYTES,
    MSG_ID_BYTES,
    LogRecord,
    Message,
    Op,
    encode_write,
)
from relay_journal.settings import FsyncPolicy, JournalSettings
from relay_journal.wal import MappedSegments, Wal, list_segments, next_generation

log = structlog.get_logger(__name__)
_monotonic = time.monotonic
HANDLES_KEPT_FREE = 256  # for the WAL, spares, sockets and everything else in the process
PREPARE_STEP_BYTES = 1 << 20
"""Logged bytes between two calls of `Wal.prepare_next`: a store that writes less than this
after a checkpoint (an idle one, most tests) never zero-fills a spare."""

_libc = ctypes.CDLL(None, use_errno=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _syncfs(path: Path) -> None:
    """Flush every dirty page and inode of the filesystem holding `path` (one syscall)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _handle_limit(wanted: int) -> int:
    """Queue-file handles the journal may hold: `wanted` (0: no wish), at most the process's
    RLIMIT_NOFILE less `HANDLES_KEPT_FREE`, and at least 2 (past it, opening a queue's file
    would fail with EMFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    allowed = 1 << 62 if soft == resource.RLIM_INFINITY else soft - HANDLES_KEPT_FREE
    if wanted and wanted <= allowed:
        return max(2, wanted)
    if wanted:
        log.warning("max_open_files_lowered", wanted=wanted, allowed=allowed, nofile_limit=soft)
    return max(2, allowed)


def _report_missing(queue_id: str, file: str, unread: int, *, acked_in_replay: int = 0) -> None:
    """A queue's write file was missing at load with `unread` messages counted in it, of which
    the replay then met `acked_in_replay` ACKs: only the rest are lost (issue 18: after a
    whole-suite SIGKILL the count used to be every message the file had held, logged before
    the replay acknowledged them, although nothing acknowledged was missing)."""
    lost = max(0, unread - acked_in_replay)
    report = log.warning if lost else log.info
    report(
        "write_file_missing",
        queue=queue_id,
        file=file,
        messages_lost=lost,
        unread_at_load=unread,
        acked_in_replay=acked_in_replay,
    )


def _install_table(root: Path, entries: list[bytes]) -> None:
    """The checkpoint's I/O: write the tail table, flush the filesystem (the table, the queue
    files and the send keys written before it), put the table in force."""
    pending = tail.write_pending(root, entries)
    _syncfs(root)
    tail.install(pending)
    fsync_dir(root)


def _done(function: Callable[..., None], *args: object) -> Future[None]:
    """`function` run here, as a finished future (its error kept in it)."""
    future: Future[None] = Future()
    try:
        function(*args)
    except Exception as error:  # handed to the future, raised by `_end_checkpoint`
        future.set_exception(error)
    else:
        future.set_result(None)
    return future


@dataclass(frozen=True)
class _InFlight:
    table: Future[None]
    """The table written, flushed and installed (on the checkpoint thread, or done here)."""
    old: list[Path]
    """The segments it makes useless."""


@dataclass(frozen=True)
class QueueInfo:
    size: int
    can_write: bool
    suspended: bool
    read: records.Pos
    write: records.Pos
    open: bool


class QueueJournal:
    def __init__(self, settings: JournalSettings, *, lazy: bool = False) -> None:
        """`lazy`: leave the replay's records to each queue's first use and to `catch_up`
        calls (the caller's, in steps: `AsyncJournal` runs them in the background)."""
        self.settings = settings
        self.root = settings.root
        self.layout = layout.load_layout(self.root, settings.path_fragments)
        self._open: OrderedDict[str, OpenQueue] = OrderedDict()
        self.max_open_queues = settings.max_open_queues
        self.handles = Handles(_handle_limit(settings.max_open_files))
        """Every open queue's file handles, bounded by what the process may hold."""
        self.auto_sync = True
        """With FsyncPolicy.ALWAYS, fsync inside each call; with BATCH, fsync in the first call
        that finds the last fsync `batch_interval_ms` old. `AsyncJournal` turns this off and
        shares fsyncs between concurrent callers (and batches them in the background) instead."""
        self.marks: dict[str, str] = {}
        """Key → value of the last `mark` (e.g. a Kafka partition → the next offset to apply)."""
        self._batch_due = 0.0
        # The write path reads these on every call: plain attributes, not settings lookups.
        self._max_queue_messages = settings.max_queue_messages
        self._max_file_messages = settings.max_file_messages
        self._prepare_step = (
            min(PREPARE_STEP_BYTES, settings.wal_segment_bytes // 2) if settings.wal_spares else 0
        )
        self._segment_limit = settings.wal_segment_bytes
        """Segment size at which a change has segment work to do (`_after_log`): every
        `_prepare_step` bytes `Wal.prepare_next`, at `wal_segment_bytes` a checkpoint."""
        self._in_flight: _InFlight | None = None
        """The checkpoint whose table is being written (see `_begin_checkpoint`)."""
        self._checkpoints: ThreadPoolExecutor | None = None
        """The checkpoint thread, started by the first full segment."""
        self._pending: dict[str, list[int]] = {}
        """Queue → positions (in `_replayed`) of the replayed records it has yet to apply."""
        self._replayed: MappedSegments | None = None
        """The segments the replay read, mapped until the opening checkpoint retires them."""
        self.sent_keys = keys.SentKeys(self.root, settings.send_key_window_s * 1000)
        """Send key → the first message written with it, for the window."""
        self.sent_keys.load(_now_ms())
        self._tail = tail.load(self.root)
        """Queue id → its entry in the tail table in force, for queues not loaded since open
        (a loaded queue's entry is applied and dropped; the next table carries the rest)."""
        segments = list_segments(self.root)
        self.wal = Wal(
            self.root,
            next_generation(self.root),
            spare_bytes=settings.wal_segment_bytes if settings.wal_spares else 0,
        )
        self._replay(segments)
        if not lazy or not self._pending:
            self.catch_up()

    # -- queues in memory ------------------------------------------------------------------

    def _queue(self, queue_id: str) -> OpenQueue:
        queue = self._open.get(queue_id)
        if queue is not None:
            self._open.move_to_end(queue_id)
            queue.last_used = time.monotonic()
            return queue
        pending = self._pending.pop(queue_id, None)
        if pending is None:
            return self._load(queue_id)
        return self._apply_pending(self._load(queue_id, caught_up=False), pending)

    def _load(self, queue_id: str, *, caught_up: bool = True) -> OpenQueue:
        """Open a queue not in memory. Not `caught_up`: the replay's records follow
        (`_apply_pending` reports a missing write file after them), and it evicts nothing."""
        layout.validate_queue_id(queue_id, self.layout.longest)
        carried = self._tail.pop(queue_id, None)
        queue = OpenQueue.load(
            queue_id,
            self.layout.paths(self.root, queue_id),
            self.settings,
            None if carried is None else tail.entry(carried),
        )
        if queue.missing is not None and caught_up:
            _report_missing(queue_id, *queue.missing)
        self._open[queue_id] = queue
        queue.handles = self.handles  # loading opened none: from here on they are counted
        queue.flush_log = self.wal.flush
        if caught_up:
            self._evict()
        return queue

    def _apply_pending(
        self, queue: OpenQueue, positions: list[int], *, evict: bool = True
    ) -> OpenQueue:
        """Apply the replay's records to `queue` (just loaded), all at once, then report its
        missing write file, if any, counting the ACKs they replayed for messages no longer in
        it, and (`evict`) close the least recently used queues beyond the bound. A record that
        cannot apply leaves the queue out of memory with its records still pending (every use
        raises `CorruptJournal` again)."""
        replayed = self._replayed
        assert replayed is not None
        missing, gone = queue.missing, queue.acks_of_gone
        for position in positions:
            record = replayed.record_at(position)
            if record.op is Op.DROP:  # only ever the first: the replay keeps none before it
                del self._open[queue.id]
                queue.remove()
                queue, missing = self._load(queue.id, caught_up=False), None
                continue
            if queue.state.lsn >= record.lsn or queue.rebuilt:
                continue
            try:
                queue.apply(record)
            except (errors.CorruptJournal, OSError) as error:
                del self._open[queue.id]
                queue.close_files()
                self._pending[queue.id] = positions
                at = f"{replayed.path_of(position).name} at byte {replayed.offset_of(position)}"
                raise errors.CorruptJournal(f"{at}: {error}") from None
        if missing is not None:
            _report_missing(queue.id, *missing, acked_in_replay=queue.acks_of_gone - gone)
        if evict:
            self._evict()
        return queue

    @property
    def pending_queues(self) -> int:
        """Queues the replay's records have not reached yet (see `catch_up`)."""
        return len(self._pending)

    def catch_up(self, queues: int | None = None, *, background: bool = False) -> int:
        """Apply the replay's records to up to `queues` queues not used since open (all if
        None), closing each again; when none is left, the opening checkpoint (its table written
        on the checkpoint thread if `background`). Returns how many queues are left."""
        if self._catch_up_queues(queues):
            if background:
                self._end_checkpoint(wait=True)
                self._begin_checkpoint(last=False, background=True)
            else:
                self.checkpoint()
        return len(self._pending)

    def _catch_up_queues(self, queues: int | None) -> bool:
        """`catch_up` without its checkpoint (which every checkpoint runs first); True once it
        applied the last queue's records (the mapping is released)."""
        if self._replayed is None:
            return False
        # A DROP logged by a close below begins no checkpoint: the table would miss the rest.
        limit, self._segment_limit = self._segment_limit, 1 << 62
        try:
            done = 0
            while self._pending and (queues is None or done < queues):
                # Closed again at once, so it evicts nothing: a checkpoint may run this in the
                # middle of a change to a queue the caller holds.
                queue_id, positions = next(iter(self._pending.items()))
                del self._pending[queue_id]
                loaded = self._load(queue_id, caught_up=False)
                self._apply_pending(loaded, positions, evict=False)
                self._close_queue(queue_id)
                done += 1
        finally:
            self._segment_limit = limit
        if self._pending:
            return False
        self._replayed.close()
        self._replayed = None
        return True

    def _evict(self) -> None:
        while len(self._open) > self.max_open_queues:
            queue_id = next(iter(self._open))
            self._close_queue(queue_id)

    def _close_queue(self, queue_id: str) -> None:
        queue = self._open.pop(queue_id)
        self.wal.flush()
        if queue.on_disk and queue.state.size == 0 and not queue.state.suspended:
            self._log(queue, LogRecord(Op.DROP, self.wal.next_lsn(), queue_id))
            self.wal.flush()
            queue.remove()
            return
        queue.save_state(self.settings)
        queue.close_files()

    def close_idle(self, idle_s: float = 0.0) -> int:
        """Close queues unused for `idle_s` seconds; returns how many were closed."""
        cutoff = time.monotonic() - idle_s
        idle = [qid for qid, q in self._open.items() if q.last_used <= cutoff]
        for queue_id in idle:
            self._close_queue(queue_id)
        return len(idle)

    @property
    def open_queues(self) -> int:
        return len(self._open)

    @property
    def checkpointing(self) -> bool:
        """The checkpoint thread is writing a table (the checkpoint then ends with a later
        change)."""
        return self._in_flight is not None and not self._in_flight.table.done()

    @property
    def open_files(self) -> int:
        return sum(q.holds_files for q in self._open.values())

    # -- logging ---------------------------------------------------------------------------

    def _log(self, queue: OpenQueue, record: LogRecord) -> int:
        self.wal.append(record)
        if record.op is not Op.DROP:
            queue.apply(record)
        self._after_log(record.lsn)
        return record.lsn

    def _after_log(self, lsn: int) -> None:
        if self.wal.segment_bytes >= self._segment_limit and self._segment_work():
            return
        self._sync_by_policy(lsn)

    def _segment_work(self) -> bool:
        """Every `_prepare_step` bytes: end a checkpoint whose table is in force, or else have
        the next spare prepared (not while one is in flight: its end recycles the segment it
        retires as the spare, which costs no writes, where a zero-fill costs a segment's); at
        `wal_segment_bytes`, begin a checkpoint unless one is still in flight (then every
        change checks it again). True if a checkpoint began: its rotation made the change
        durable."""
        self._end_checkpoint()
        size = self.wal.segment_bytes
        if size >= self.settings.wal_segment_bytes:
            if self._in_flight is None:
                self._begin_checkpoint(last=False, background=True)
                return True
            return False
        if self._in_flight is None:
            self.wal.prepare_next()
        self._segment_limit = min(size + self._prepare_step, self.settings.wal_segment_bytes)
        return False

    def _sync_by_policy(self, lsn: int) -> None:
        if self.auto_sync:
            fsync = self.settings.fsync
            if fsync is FsyncPolicy.ALWAYS:
                self.wal.sync_to(lsn)
            elif fsync is FsyncPolicy.BATCH:
                now = time.monotonic()
                if now >= self._batch_due:
                    self.wal.sync_to(lsn)
                    self._batch_due = now + self.settings.batch_interval_ms / 1000

    # -- operations ------------------------------------------------------------------------

    def create(self, queue_id: str) -> None:
        """Check the id and that the queue holds nothing (an empty, active queue is the same as
        none). Nothing is written: a queue's folder appears with its first message (or its
        suspension), and the queue records themselves are the store log's (issue 5)."""
        layout.validate_queue_id(queue_id, self.layout.longest)
        known = (
            queue_id in self._open
            or queue_id in self._pending
            or any(layout.is_queue_folder(p) for p in self.layout.paths(self.root, queue_id))
        )
        if known:
            state = self._queue(queue_id).state
            if state.size or state.suspended:
                raise errors.QueueExists(queue_id)

    def write(
        self,
        queue_id: str,
        msg_id: bytes,
        body: bytes,
        *,
        ts_ms: int,
        expires_ms: int = 0,
        key: bytes = b"",
        marker: bool = False,
    ) -> int:
        """Append a message; returns its lsn. At the quota the first refusal appends the quota
        marker; refusals raise `QuotaExceeded` or `QueueSuspended`. A `key` (1 to 255 bytes,
        the caller's name for this send, unique across queues) is logged in the message's
        record and answered by `sent` from then on; a refused write logs no key. `marker`
        appends the quota marker below the quota too: a queue copied from another whose
        marker outlived the messages before it (acked or expired) is rebuilt as it was.

        The hot path of the engine: it encodes the message once and the log record from it,
        with no intermediate record object (a replay of the record goes through `apply`)."""
        if len(msg_id) != MSG_ID_BYTES:
            raise ValueError("msg_id must be 24 bytes")
        if len(body) > MAX_BODY_BYTES:
            raise ValueError("body too large")
        if len(key) > keys.MAX_KEY_BYTES:
            raise ValueError(f"send keys are at most {keys.MAX_KEY_BYTES} bytes")
        opened = self._open
        queue = opened.get(queue_id)
        if queue is None:
            queue = self._queue(queue_id)
        else:
            opened.move_to_end(queue_id)
            queue.last_used = _monotonic()  # as `_queue` does: a written queue is not idle
        state = queue.state
        if state.suspended:
            raise errors.QueueSuspended(queue_id)
        if not state.can_write:
            raise errors.QuotaExceeded(queue_id)
        quota = marker or state.size >= self._max_queue_messages
        write = state.write
        # Rotate at `max_file_messages`. A queue that was drained goes on in the same file (read
        # and write positions meet there): a fresh file per message of a queue read as fast as
        # it is written cost an unlink and a create each, a fifth of the queue-writer's time.
        # What a drained file holds is removed with the folder when the queue closes empty.
        file = new_file_id() if write.msg >= self._max_file_messages else write.file
        wal = self.wal
        lsn = wal.next_lsn()
        prefix = queue.log_prefix(file)
        if quota:
            data, logged = encode_write(lsn, prefix, msg_id, ts_ms, 0, b"", FLAG_QUOTA)
        else:
            data, logged = encode_write(lsn, prefix, msg_id, ts_ms, expires_ms, body, 0, key)
        log_file = wal.file
        log_file.append(lsn, logged)
        queue.append(file, data, quota, lsn)
        if key and not quota:
            self.sent_keys.add(key, keys.Sent(msg_id, ts_ms))  # before a checkpoint saves keys
        if self.auto_sync or log_file.file_bytes >= self._segment_limit:
            self._after_log(lsn)
        if quota:
            raise errors.QuotaExceeded(queue_id)
        return lsn

    def sent(self, key: bytes, now_ms: int) -> keys.Sent | None:
        """The message first written with send `key` (its id and timestamp), if that was
        less than `send_key_window_s` before `now_ms`."""
        return self.sent_keys.get(key, now_ms)

    def peek(self, queue_id: str, *, now_ms: int | None = None) -> Message | None:
        """The head message (cached after the first read), dropping expired ones first."""
        queue = self._queue(queue_id)
        if now_ms is not None:
            self._expire(queue, now_ms)
        return queue.peek()

    def ack(self, queue_id: str, msg_id: bytes) -> int:
        """Acknowledge the head; `NoMessage` if `msg_id` is not the head."""
        queue = self._queue(queue_id)
        head = queue.peek()
        if head is None or head.msg_id != msg_id:
            raise errors.NoMessage(queue_id)
        return self._log(queue, LogRecord(Op.ACK, self.wal.next_lsn(), queue_id, msg_id=msg_id))

    def suspend(self, queue_id: str) -> int:
        queue = self._queue(queue_id)
        if queue.state.suspended:
            return queue.state.lsn
        return self._log(queue, LogRecord(Op.SUSPEND, self.wal.next_lsn(), queue_id))

    def delete(self, queue_id: str) -> int:
        """Remove the queue's folder and everything in it."""
        queue = self._queue(queue_id)
        lsn = self._log(queue, LogRecord(Op.DROP, self.wal.next_lsn(), queue_id))
        self.wal.flush()
        del self._open[queue_id]
        queue.remove()
        return lsn

    def mark(self, key: str, value: str, *, alone: bool = False) -> int:
        """Log `value` for `key` (a caller's position in its source of commands) in order with
        the changes; returns its lsn. Log it before applying what it covers: the change cannot
        then be durable without it.

        The MARK stays buffered until the change after it is logged (`Wal.flush` keeps it;
        a full segment's checkpoint waits for the change), and both reach the file in one
        write. A SIGKILL can still cut that write at a page boundary between them, so the
        replay trusts a MARK only once a record follows it: a mark the log ends on is
        dropped and the caller resumes before it. `alone`: a position with no change after
        it (an installed partition's, a restore's) is logged at once as a record of every
        mark, trusted by itself."""
        if not key or len(key.encode()) > 255:
            raise ValueError("mark keys are 1 to 255 bytes")
        lsn = self.wal.next_lsn()
        self.marks[key] = value
        if alone:
            self.wal.append(LogRecord(Op.CHECKPOINT, lsn, "", marks=dict(self.marks)))
        else:
            self.wal.append(LogRecord(Op.MARK, lsn, key, marks={key: value}), hold=True)
        self._sync_by_policy(lsn)
        return lsn

    def expire(self, queue_id: str, now_ms: int) -> int:
        """Drop expired messages from the head; returns how many."""
        return self._expire(self._queue(queue_id), now_ms)

    def _expire(self, queue: OpenQueue, now_ms: int) -> int:
        dropped = 0
        while (head := queue.peek()) is not None and not head.quota and head.expired(now_ms):
            self._log(
                queue,
                LogRecord(Op.ACK, self.wal.next_lsn(), queue.id, msg_id=head.msg_id, expired=True),
            )
            dropped += 1
        return dropped

    def expire_all(
        self, now_ms: int, keep: Callable[[str], bool] | None = None
    ) -> Iterator[tuple[str, int]]:
        """Expire every queue on disk (those `keep` accepts, if given), open or not, walking
        the folders lazily; yields (queue id, dropped) for queues that lost messages. Queues
        it opens are closed again."""
        for fragments in {self.layout.current, self.layout.fragments_for_new}:
            for queue_id, _ in layout.iter_queue_dirs(self.root, fragments):
                if keep is not None and not keep(queue_id):
                    continue
                was_open = queue_id in self._open
                dropped = self.expire(queue_id, now_ms)
                if not was_open and queue_id in self._open:
                    self._close_queue(queue_id)
                if dropped:
                    yield queue_id, dropped

    def messages(self, queue_id: str, *, keep_open: bool = True) -> list[Message]:
        """The queue's messages in order, without delivering or acknowledging any. With
        `keep_open=False`, a queue that was not open is closed again after the read (as `check`
        does), so reading every queue once (an export) does not evict the busy ones."""
        was_open = queue_id in self._open
        try:
            return self._queue(queue_id).messages()
        finally:
            if not keep_open and not was_open and queue_id in self._open:
                self._close_queue(queue_id)

    def check(self) -> list[str]:
        """Integrity check of every queue on disk (opens each; repairs what loading repairs):
        every message readable, the count equal to the recorded size. Returns the problems."""
        self.catch_up()
        problems: list[str] = []
        for fragments in {self.layout.current, self.layout.fragments_for_new}:
            for queue_id, _ in layout.iter_queue_dirs(self.root, fragments):
                was_open = queue_id in self._open
                try:
                    queue = self._queue(queue_id)
                    found = len(queue.messages())
                    if found != queue.state.size:
                        problems.append(
                            f"{queue_id}: {found} messages, size says {queue.state.size}"
                        )
                except (records.RecordError, OSError, errors.JournalError) as error:
                    problems.append(f"{queue_id}: {error}")
                if not was_open and queue_id in self._open:
                    self._close_queue(queue_id)
        return problems

    def stats(self) -> Iterator[tuple[str, int, int]]:
        """(queue id, messages, message bytes) of every queue holding something, lazily. Closed
        queues are read from their state line without being opened (a closed queue's line is
        current: closing writes it; or its tail table entry, when newer), so this costs one
        small read per queue on disk and no memory; callers may yield to other work between
        items. A queue a lazy open has not reached applies its replayed records first (as any
        use does), one per item: the walk never holds the caller for the whole catch-up."""
        seen = set()
        for queue_id, queue in list(self._open.items()):
            seen.add(queue_id)
            if queue.state.size:
                yield queue_id, queue.state.size, span_bytes(queue.folder, queue.state)
        for queue_id in list(self._pending):
            if queue_id in seen:
                continue
            seen.add(queue_id)
            was_open = queue_id in self._open
            queue = self._queue(queue_id)
            size = queue.state.size
            span = span_bytes(queue.folder, queue.state) if size else 0
            if not was_open and queue_id in self._open:
                self._close_queue(queue_id)
            if size:
                yield queue_id, size, span
        for fragments in {self.layout.current, self.layout.fragments_for_new}:
            for queue_id, folder in layout.iter_queue_dirs(self.root, fragments):
                if queue_id in seen or queue_id in self._open:
                    continue
                seen.add(queue_id)
                state, _ = read_state_file(queue_id, folder)
                carried = self._tail.get(queue_id)
                if carried is not None:
                    newer = tail.entry(carried).state
                    state = newer if state is None or newer.lsn > state.lsn else state
                if state is not None and state.size:
                    yield queue_id, state.size, span_bytes(folder, state)

    def size(self, queue_id: str) -> int:
        return self._queue(queue_id).state.size

    def info(self, queue_id: str) -> QueueInfo:
        was_open = queue_id in self._open
        state = self._queue(queue_id).state
        return QueueInfo(
            state.size, state.can_write, state.suspended, state.read, state.write, was_open
        )

    # -- durability ------------------------------------------------------------------------

    def sync(self) -> None:
        """Make everything logged so far durable."""
        self.wal.sync_to(self.wal.written_lsn)

    def checkpoint(self, *, last: bool = False) -> None:
        """A whole checkpoint, here and now (at open, at close, and for callers): after it,
        opening replays nothing written before it. The `last` one (closing) leaves the spare
        for the next open. A checkpoint a full segment began in the background ends first."""
        self._end_checkpoint(wait=True)
        self._begin_checkpoint(last=last, background=False)
        self._end_checkpoint(wait=True)

    def _begin_checkpoint(self, *, last: bool, background: bool) -> None:
        """Gather the tail table's records (every queue whose queue.log is behind, with its
        buffered appends up to `tail_unwritten_bytes` in all; the rest are written to their
        files) and the send keys, then start a new WAL segment: the table covers every change
        of the older segments. Its write, the filesystem flush and its install run on the
        checkpoint thread if `background` (a full segment's: ~1 s of I/O at 100,000 queues
        the event loop no longer waits for, issue 18); the older segments are deleted only in
        `_end_checkpoint`, after that, so a crash before it replays them."""
        self._catch_up_queues(None)
        self.wal.flush()
        budget = self.settings.tail_unwritten_bytes
        entries: list[bytes] = []
        for queue in self._open.values():
            carry = queue.unwritten_bytes <= budget
            if carry:
                budget -= queue.unwritten_bytes
            record = queue.tail_record(carry=carry)
            if record is not None:
                entries.append(record)
        entries.extend(self._tail.values())
        self.sent_keys.persist(_now_ms())  # durable by the syncfs, before the WAL is retired
        old = self.wal.rotate(last=last)
        self._segment_limit = self._prepare_step or self.settings.wal_segment_bytes
        if not background:
            self._in_flight = _InFlight(_done(_install_table, self.root, entries), old)
            return
        if self._checkpoints is None:
            self._checkpoints = ThreadPoolExecutor(1, thread_name_prefix="journal-checkpoint")
        self._in_flight = _InFlight(
            self._checkpoints.submit(_install_table, self.root, entries), old
        )

    @property
    def checkpoint_table(self) -> Future[None] | None:
        """The write of the tail table of the checkpoint in flight, if any."""
        return None if self._in_flight is None else self._in_flight.table

    def end_checkpoint(self) -> None:
        """End the checkpoint in flight if its table is in force (otherwise a later change or
        call ends it)."""
        self._end_checkpoint()

    def _end_checkpoint(self, *, wait: bool = False) -> None:
        """Once the checkpoint in flight has its table in force (at once if `wait`): log the
        checkpoint's record (every mark) and delete the segments before it (one may become the
        next spare). A background table that failed to install keeps those segments (logged;
        the next checkpoint retires them); a checkpoint run here raises."""
        in_flight = self._in_flight
        if in_flight is None or not (wait or in_flight.table.done()):
            return
        self._in_flight = None
        error = in_flight.table.exception()
        if error is not None:
            if wait:
                raise error
            log.error("checkpoint_failed", error=str(error), kept_segments=len(in_flight.old))
            return
        self.wal.append(LogRecord(Op.CHECKPOINT, self.wal.next_lsn(), "", marks=dict(self.marks)))
        self.wal.sync_to(self.wal.written_lsn)
        self.wal.retire(in_flight.old)
        fsync_dir(self.wal.folder)

    def close(self) -> None:
        """Close every queue and checkpoint. Queues a lazy open's replay has not reached are
        left as they are, with the segments that hold their records: the next open replays
        those again (as after a crash, with everything here durable), so a shutdown soon after
        a crash does not wait for the whole catch-up."""
        for queue_id in list(self._open):
            self._close_queue(queue_id)
        if not self._pending:
            self.checkpoint(last=True)
        else:
            assert self._replayed is not None
            self.sync()
            self._replayed.close()
            self._replayed = None
        if self._checkpoints is not None:
            self._checkpoints.shutdown()
        self.wal.close()

    # -- recovery --------------------------------------------------------------------------

    def _replay(self, segments: list[Path]) -> None:
        """Read every logged change the queue files may lack and note, per queue, where its
        records are (applied later: see the module invariants); marks and send keys are taken
        here."""
        self._replayed = replayed = MappedSegments(segments)
        pending = self._pending
        count = 0
        unconfirmed: dict[str, str] = {}
        """MARKs read with no record after them yet: trusted once one follows (`mark`)."""
        for record, position in replayed.read():
            count += 1
            if record.op is Op.MARK and record.marks is not None:
                unconfirmed.update(record.marks)
                continue
            self.marks.update(unconfirmed)
            unconfirmed = {}
            if record.op is Op.CHECKPOINT:
                if record.marks is not None:
                    self.marks = dict(record.marks)  # every mark
                continue
            if record.op is Op.DROP:
                pending[record.queue] = [position]  # what it logged before is gone with it
                continue
            if record.op is Op.WRITE_KEYED and record.message is not None:
                self.sent_keys.add(
                    record.key, keys.Sent(record.message.msg_id, record.message.ts_ms)
                )
            positions = pending.get(record.queue)
            if positions is None:
                pending[record.queue] = [position]
            else:
                positions.append(position)
        if unconfirmed:
            log.info("trailing_marks_dropped", keys=sorted(unconfirmed))
        if segments:
            log.info("journal_replayed", segments=len(segments), records=count, queues=len(pending))
