"""One queue's folder: message files and the `queue.log` state file (seed 000's algorithm).

Invariants:
- `state` in memory is the queue's truth; `queue.log` holds it as of the last close (appended,
  last valid line wins), the checkpoint's tail table (`relay_journal.tail`) as of the last
  checkpoint when that is newer, and the write-ahead log holds every change after that, so a
  state line never needs to be fsynced on the write path;
- on load, message files are truncated to the recorded write position (bytes past it were never
  acknowledged) and every missing-file combination is repaired with a warning (a missing write
  file is reported by the journal, after any replay: `missing`); the write file is
  truncated to the recorded position again whenever its handle is opened and when it is rotated
  away, and every append is a pwrite at that position;
- a queue with no messages holds no open file; a queue whose read and write file are the
  same holds one handle (read-write) for both; every handle is counted in the journal's pool
  (`relay_journal.handles`), which may close it between operations (`release_files`) and the
  next use opens it again; `apply()` is deterministic, so replaying a log record reproduces
  exactly what the live write did;
- a message file is created or removed only after the log records that name or empty it are
  handed to the OS (`flush_log`, the journal's `wal.flush`): a crash never leaves a head that
  points into a removed file, nor a file no record refers to (a queue holds at most two:
  the quota is below a file's worth);
- live appends to the write file are coalesced (one pwrite for up to `UNWRITTEN_LIMIT` bytes of
  records): the log already holds them, and they reach the file before anything reads the file,
  rotates or closes it, or writes a state line that counts them (a tail table entry carries
  them instead). Buffering needs no open handle once the write file has been opened (and
  truncated to its recorded position) in this queue's life: nothing else writes it, so its
  length stays where the last write left it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from relay_journal import errors, layout, records, tail
from relay_journal.handles import Handles
from relay_journal.records import Message, Pos, QueueState
from relay_journal.settings import JournalSettings

log = structlog.get_logger(__name__)

STATE_FILE = layout.STATE_FILE
UNWRITTEN_LIMIT = 64 * 1024  # bytes of appended records held before one pwrite writes them


_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__ (the write path)
_UNBOUNDED = Handles(1 << 62)


def _nothing() -> None:
    pass


def new_file_id() -> str:
    return secrets.token_hex(4)


def message_file(folder: Path, file_id: str) -> Path:
    return folder / f"messages.{file_id}.log"


def fresh_state(lsn: int = 0, suspended: bool = False) -> QueueState:
    file_id = new_file_id()
    return QueueState(
        read=Pos(file_id, 0, 0), write=Pos(file_id, 0, 0), size=0, suspended=suspended, lsn=lsn
    )


class OpenQueue:
    def __init__(
        self, queue_id: str, folder: Path, state: QueueState, *, on_disk: bool, state_lines: int
    ) -> None:
        self.id = queue_id
        self.id_bytes = queue_id.encode()
        self._prefix_file = ""
        self._prefix = b""
        self.folder = folder
        self.state = state
        self.on_disk = on_disk
        self.state_lines = state_lines
        self.written_lsn = state.lsn if on_disk else -1
        """lsn of the last state line written; -1 when no queue.log exists."""
        self._write_fd = -1
        """The write file, read-write: also the read handle while read and write file are one."""
        self._read_fd = -1
        """The read file while it is not the write file."""
        self._write_ready = False
        """The write file was opened in this queue's life (and truncated to its position):
        appends may be buffered without a handle."""
        self.handles: Handles = _UNBOUNDED
        """The pool counting this queue's handles (the journal's, set once loaded)."""
        self.flush_log: Callable[[], None] = _nothing
        """Hands the log's buffered records to the OS; runs before a message file is created or
        removed (the journal's `wal.flush`, set once loaded)."""
        self._unwritten: list[bytes] = []
        """Records appended by `append` and not yet in the write file, from `_unwritten_at`."""
        self._unwritten_at = 0
        self._unwritten_bytes = 0
        self._read_file = ""
        self.head: tuple[Message, int] | None = None
        """The next message and the byte after it in the read file, once read (not re-read)."""
        self.last_used = time.monotonic()
        self.rebuilt = False
        """State was rebuilt from the message files (queue.log unusable): the files already hold
        every logged write, so replay skips this queue's records."""
        self.missing: tuple[str, int] | None = None
        """Set by `load` when the write file was missing: its id and the unread messages the
        state line counted in it. The journal reports them (`write_file_missing`), after the
        replay when loaded by it, since the replay may acknowledge them (`acks_of_gone`)."""
        self.acks_of_gone = 0
        """Logged ACKs replayed for messages no longer in the files (see `_apply_ack`)."""

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        queue_id: str,
        candidates: list[Path],
        settings: JournalSettings,
        carried: tail.Entry | None = None,
    ) -> OpenQueue:
        """The queue as its folder holds it, or as `carried` (its entry in the checkpoint's
        tail table) holds it when that is newer than its `queue.log`."""
        for folder in candidates:
            if (folder / STATE_FILE).exists():
                return cls._load_folder(queue_id, folder, settings, carried)
            if folder.exists() and any(folder.glob("messages.*.log")):
                return cls._load_folder(queue_id, folder, settings, carried)
        return cls(queue_id, candidates[0], fresh_state(), on_disk=False, state_lines=0)

    @classmethod
    def _load_folder(
        cls, queue_id: str, folder: Path, settings: JournalSettings, carried: tail.Entry | None
    ) -> OpenQueue:
        state, lines = read_state_file(queue_id, folder)
        line_lsn = -1 if state is None else state.lsn
        if carried is not None and carried.state.lsn > line_lsn:
            # The table is newer than queue.log: its buffered appends go where it says, in its
            # write file (they end at its recorded write position, which nothing passed).
            if carried.unwritten:
                path = message_file(folder, carried.state.write.file)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    os.pwrite(fd, carried.unwritten, carried.unwritten_at)
                finally:
                    os.close(fd)
            state = carried.state
        rebuilt = state is None
        if state is None:
            state = _rebuild_state(queue_id, folder)
            lines = 0
        repaired, missing = _repair_files(queue_id, folder, state)
        queue = cls(queue_id, folder, repaired, on_disk=True, state_lines=lines)
        queue.rebuilt = rebuilt
        queue.missing = missing
        if state.lsn != line_lsn:
            queue.written_lsn = line_lsn  # queue.log is behind: the next checkpoint tables it
        if lines == 0 or lines > settings.state_compact_lines or repaired != state:
            queue.compact(settings)  # record a repair once, not at every load
        return queue

    # -- files -----------------------------------------------------------------------------

    def _ensure_folder(self) -> None:
        if self.on_disk:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / STATE_FILE).open("wb") as f:
            f.write(records.encode_state(self.state))
        self.on_disk = True
        self.state_lines = 1
        self.written_lsn = self.state.lsn

    def _writer(self, *, create: bool = True) -> int:
        """The write file's handle (read-write), opened if needed; `create=False` (to read
        it) raises FileNotFoundError for a missing file, as a read-only open would."""
        if self._write_fd < 0:
            path = message_file(self.folder, self.state.write.file)
            fd = os.open(path, os.O_RDWR | os.O_CREAT if create else os.O_RDWR, 0o600)
            # Seed 000: truncate to the recorded position before appending. While the queue
            # is in memory every append is a pwrite at the recorded position (buffered ones
            # included), and rotation truncates the file it leaves, so no byte past a
            # recorded position is ever read. Reopened after `release_files`, the file ends
            # at or before the position (buffered appends not yet written): nothing to cut.
            if os.fstat(fd).st_size > self.state.write.byte:
                os.ftruncate(fd, self.state.write.byte)
            self._write_fd = fd
            self._write_ready = True
            self.handles.opened(self)
        else:
            self.handles.touch(self)
        return self._write_fd

    def _reader(self) -> int:
        state = self.state
        if state.read.file == state.write.file:
            if self._read_fd >= 0:
                self._close_read()
            return self._writer(create=False)  # one handle for both
        if self._read_fd >= 0 and self._read_file != state.read.file:
            self._close_read()
        if self._read_fd < 0:
            self._read_fd = os.open(message_file(self.folder, state.read.file), os.O_RDONLY)
            self._read_file = state.read.file
            self.handles.opened(self)
        else:
            self.handles.touch(self)
        return self._read_fd

    def _close_write(self) -> None:
        os.close(self._write_fd)
        self._write_fd = -1
        self.handles.closed(self, still_holds=self._read_fd >= 0)

    def _close_read(self) -> None:
        os.close(self._read_fd)
        self._read_fd = -1
        self._read_file = ""
        self.handles.closed(self, still_holds=self._write_fd >= 0)

    def _write_unwritten(self, *, transient: bool = False) -> None:
        """Write the buffered appends; `transient`: through a handle closed at once when the
        pool holds none for this queue (buffering implies the file was opened and truncated
        in this queue's life, so this open needs no truncation)."""
        if self._unwritten:
            data = b"".join(self._unwritten)
            if transient and self._write_fd < 0:
                fd = os.open(f"{self.folder}/messages.{self.state.write.file}.log", os.O_WRONLY)
                try:
                    os.pwrite(fd, data, self._unwritten_at)
                finally:
                    os.close(fd)
            else:
                os.pwrite(self._writer(), data, self._unwritten_at)
            self._unwritten.clear()
            self._unwritten_bytes = 0

    def close_files(self) -> None:
        self._write_unwritten()
        self.release_files()

    def release_files(self) -> None:
        """Close this queue's handles, keeping its state (the handle pool's eviction). Appends
        buffered while the write file is open are written first; those buffered without a
        handle stay buffered (writing them would take a handle back)."""
        if self._write_fd >= 0:
            self._write_unwritten()
            self._close_write()
        if self._read_fd >= 0:
            self._close_read()

    @property
    def holds_files(self) -> bool:
        return self._write_fd >= 0 or self._read_fd >= 0

    # -- reading ---------------------------------------------------------------------------

    def peek(self) -> Message | None:
        """The head message, read once and cached; None when the queue is empty."""
        if self.head is not None:
            return self.head[0]
        self._write_unwritten()
        while self.state.size > 0:
            read = self.state.read
            if read.file != self.state.write.file and read.byte >= self._read_file_size():
                self._switch_read_file("end of read file reached")
                continue
            try:
                message, end = self._read_record(read.byte)
            except (records.RecordError, FileNotFoundError) as error:
                # Damaged or gone: what it held cannot be served. Any other OSError (no file
                # handle left, an I/O error) says nothing about the data: it propagates and
                # nothing is dropped (it dropped messages when the process ran out of handles).
                self._drop_unreadable(str(error))
                continue
            self.head = (message, end)
            return message
        self.close_files()
        return None

    def messages(self) -> list[Message]:
        """Every message from the head on, read-only (for checks and tests)."""
        self._write_unwritten()
        out: list[Message] = []
        state = self.state
        files = (
            [state.read]
            if state.read.file == state.write.file
            else [state.read, Pos(state.write.file, 0, 0)]
        )
        for start in files:
            path = message_file(self.folder, start.file)
            end = state.write.byte if start.file == state.write.file else None
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            at = start.byte
            while at < (end if end is not None else len(data)):
                message, at = records.decode_message(data, at)
                out.append(message)
        return out

    def _read_file_size(self) -> int:
        try:
            return os.fstat(self._reader()).st_size
        except FileNotFoundError:
            return 0

    def _read_record(self, offset: int) -> tuple[Message, int]:
        fd = self._reader()
        head = os.pread(fd, records.MSG_HEADER_BYTES, offset)
        if len(head) < records.MSG_HEADER_BYTES:
            raise records.RecordError("torn message header")
        length = int.from_bytes(head[2:6], "big")
        if length > records.MAX_BODY_BYTES:
            raise records.RecordError(f"message body length {length} is out of range")
        data = head + os.pread(fd, length, offset + records.MSG_HEADER_BYTES)
        message, end = records.decode_message(data)
        return message, offset + end

    def _switch_read_file(self, why: str) -> None:
        old = self.state.read.file
        remaining = self.state.write.msg
        if self.state.size != remaining:
            log.warning("queue_size_corrected", queue=self.id, was=self.state.size, now=remaining)
        self.state = self.state.evolve(read=Pos(self.state.write.file, 0, 0), size=remaining)
        self.head = None
        if self._read_fd >= 0:
            self._close_read()
        self._remove_file(old)
        log.debug("read_file_switched", queue=self.id, why=why)

    def _remove_file(self, file_id: str) -> None:
        """Remove a message file whose messages are all acknowledged: the acks first reach the
        OS, or a crash could keep a log that still points into the file."""
        self.flush_log()
        message_file(self.folder, file_id).unlink(missing_ok=True)

    def _drop_unreadable(self, error: str) -> None:
        """A record at the read position cannot be read: lose the rest of that file (and say so)
        rather than stop serving the queue."""
        read, write = self.state.read, self.state.write
        other_file = read.file != write.file
        log.warning(
            "unreadable_messages_dropped",
            queue=self.id,
            file=read.file,
            offset=read.byte,
            messages=None if other_file else write.msg - read.msg,
            error=error,
        )
        if other_file:
            self._switch_read_file("unreadable record")
            return
        if self._write_fd >= 0:
            os.ftruncate(self._write_fd, read.byte)
        else:
            with open(message_file(self.folder, read.file), "r+b") as f:
                f.truncate(read.byte)
        self.state = self.state.evolve(write=read, size=0, can_write=True)

    # -- applying log records --------------------------------------------------------------

    def apply(self, record: records.LogRecord) -> None:
        """Apply one logged change (live or during replay); sets `state.lsn`."""
        if record.op is records.Op.WRITE or record.op is records.Op.WRITE_KEYED:
            assert record.message is not None
            message = record.message
            data = record.message_bytes or records.encode_message(message)
            self._apply_write(file_id=record.file, data=data, quota=message.quota)
        elif record.op is records.Op.ACK:
            self._apply_ack(record.msg_id)
        elif record.op is records.Op.SUSPEND:
            self._ensure_folder()
            self.state.suspended = True
        self.state.lsn = record.lsn

    def log_prefix(self, file_id: str) -> bytes:
        """`records.write_log_prefix` of this queue and `file_id`, kept until the file changes."""
        if file_id != self._prefix_file:
            self._prefix_file = file_id
            self._prefix = records.write_log_prefix(self.id_bytes, file_id.encode())
        return self._prefix

    def append(self, file_id: str, data: bytes, quota: bool, lsn: int) -> None:
        """The live write path: `apply` of a WRITE record without building the record.
        `data` is the encoded message."""
        state = self.state
        write = state.write
        if not self.on_disk or file_id != write.file or not self._write_ready:
            self._apply_write(file_id, data, quota)
        else:
            if not self._unwritten:
                self._unwritten_at = write.byte
            self._unwritten.append(data)
            self._unwritten_bytes += len(data)
            if self._unwritten_bytes >= UNWRITTEN_LIMIT:
                self._write_unwritten()
            state.write = _new_tuple(Pos, (file_id, write.msg + 1, write.byte + len(data)))
            state.size += 1
            if quota:
                state.can_write = False
        state.lsn = lsn

    def _apply_write(self, file_id: str, data: bytes, quota: bool) -> None:
        self._write_unwritten()
        self._ensure_folder()
        state = self.state
        write = state.write
        if file_id != write.file:
            if self._write_fd >= 0:
                os.ftruncate(self._write_fd, write.byte)  # it is read to its end from now on
                self._close_write()
            self._write_ready = False
            write = Pos(file_id, 0, 0)
            # The log names the new file before it exists: a crash never leaves a file that no
            # state or record refers to. A replay may meet a torn file of that name: start it
            # again.
            self.flush_log()
            message_file(self.folder, file_id).unlink(missing_ok=True)
            if state.size == 0:
                # Nothing left to read in the old file: read from the new one.
                self._remove_file(state.read.file)
                state.read = write
                self.head = None
            state.write = write
        # pwrite at the recorded position: bytes past it (a torn append) are overwritten.
        os.pwrite(self._writer(), data, write.byte)
        state.write = Pos(write.file, write.msg + 1, write.byte + len(data))
        state.size += 1
        if quota:
            state.can_write = False

    def _apply_ack(self, msg_id: bytes) -> None:
        head = self.peek()
        if head is None or head.msg_id != msg_id:
            if all(m.msg_id != msg_id for m in self.messages()):
                # Replaying an ack whose message is already gone: its read file was consumed
                # and deleted before the crash (the state line predates the switch).
                self.acks_of_gone += 1
                return
            raise errors.CorruptJournal(
                f"queue {self.id}: logged ack of a message that is not the head"
            )
        assert self.head is not None
        _, end = self.head
        self.head = None
        state = self.state
        read = state.read
        state.read = Pos(read.file, read.msg + 1, end)
        state.size -= 1
        if state.size == 0:
            state.can_write = True
        if read.file != state.write.file and end >= self._read_file_size():
            self._switch_read_file("acked the last message of the read file")
        if state.size == 0:
            self.close_files()

    # -- state file ------------------------------------------------------------------------

    def tail_record(self, *, carry: bool) -> bytes | None:
        """This queue's entry for the checkpoint's tail table, or None when `queue.log` is
        current and nothing is buffered. `carry`: the buffered appends travel in the entry
        and stay buffered; otherwise they are written to the write file first."""
        if not self.on_disk or (self.written_lsn == self.state.lsn and not self._unwritten):
            return None
        if not carry:
            self._write_unwritten(transient=True)
        return tail.encode(
            self.id_bytes,
            records.encode_state(self.state),
            self._unwritten_at,
            b"".join(self._unwritten),
        )

    @property
    def unwritten_bytes(self) -> int:
        return self._unwritten_bytes

    def save_state(self, settings: JournalSettings) -> bool:
        """Append the state line if it changed; True if something was written."""
        if not self.on_disk or self.written_lsn == self.state.lsn:
            return False
        # The line counts those bytes: they must be in the file first. A checkpoint saves
        # every queue written since the last one (100,000 of them in issue 18's benchmark):
        # a queue whose handle the pool closed is written through a handle of its own, not
        # taken from the pool, which would close another queue's for it.
        self._write_unwritten(transient=True)
        if self.state_lines + 1 > settings.state_compact_lines:
            self.compact(settings)
            return True
        fd = os.open(f"{self.folder}/{STATE_FILE}", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, records.encode_state(self.state))
        finally:
            os.close(fd)
        self.state_lines += 1
        self.written_lsn = self.state.lsn
        return True

    def compact(self, settings: JournalSettings) -> None:
        """Keep a timestamped copy of queue.log, then rewrite it as one line (atomic rename)."""
        path = self.folder / STATE_FILE
        if path.exists() and self.state_lines > 1:
            stamp = (
                time.strftime("%Y%m%dT%H%M%S", time.gmtime())
                + f"{time.time_ns() % 1_000_000_000:09d}"
            )
            shutil.copyfile(path, self.folder / f"queue.{stamp}.log")
            _prune_backups(self.folder, settings)
        tmp = self.folder / (STATE_FILE + ".tmp")
        with tmp.open("wb") as f:
            f.write(records.encode_state(self.state))
        tmp.replace(path)
        self.state_lines = 1
        self.written_lsn = self.state.lsn

    def remove(self) -> None:
        """Remove the queue's folder. The fragment folders above it stay: they are shared, cost
        no file, and removing them would cost four rmdirs per emptied queue."""
        self._unwritten.clear()
        self._unwritten_bytes = 0
        self.close_files()
        self._write_ready = False
        shutil.rmtree(self.folder, ignore_errors=True)
        self.on_disk = False
        self.head = None


def _prune_backups(folder: Path, settings: JournalSettings) -> None:
    backups = sorted(folder.glob("queue.*.log"), reverse=True)
    now = time.time()
    for old in backups[settings.state_backups_keep :]:
        try:
            if now - old.stat().st_mtime > settings.state_backups_max_age_s:
                old.unlink()
        except FileNotFoundError:
            pass


def span_bytes(folder: Path, state: QueueState) -> int:
    """Bytes of the message records between the read and the write position (a queue has at
    most two message files: the quota is below the rotation size)."""
    if state.size == 0:
        return 0
    if state.read.file == state.write.file:
        return state.write.byte - state.read.byte
    try:
        read_size = os.path.getsize(message_file(folder, state.read.file))
    except OSError:
        read_size = state.read.byte
    return read_size - state.read.byte + state.write.byte


def read_state_file(queue_id: str, folder: Path) -> tuple[QueueState | None, int]:
    """The last valid line of queue.log and the number of lines; (None, 0) if there is none."""
    try:
        data = (folder / STATE_FILE).read_bytes()
    except FileNotFoundError:
        log.warning("state_file_missing", queue=queue_id, folder=str(folder))
        return None, 0
    lines = data.splitlines(keepends=True)
    for index in range(len(lines) - 1, -1, -1):
        try:
            state = records.decode_state(lines[index])
        except records.RecordError as error:
            log.warning("state_line_ignored", queue=queue_id, line=index + 1, error=str(error))
            continue
        return state, len(lines)
    log.warning("state_file_unreadable", queue=queue_id, folder=str(folder))
    return None, 0


def _scan(path: Path) -> tuple[int, int, int]:
    """(valid messages, bytes they span, ts of the first) of a message file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0, 0, 0
    count = at = first_ts = 0
    while at < len(data):
        try:
            message, at_next = records.decode_message(data, at)
        except records.RecordError:
            break
        first_ts = first_ts or message.ts_ms
        count, at = count + 1, at_next
    return count, at, first_ts


def _rebuild_state(queue_id: str, folder: Path) -> QueueState:
    """No usable queue.log: rebuild from the message files. Reading restarts at the oldest
    file's first message, so acknowledged messages may be delivered again (never lost)."""
    files = []
    for path in folder.glob("messages.*.log"):
        count, end, first_ts = _scan(path)
        files.append((first_ts, path.name.split(".")[1], count, end))
    files.sort()
    if not files:
        return fresh_state()
    log.warning("state_rebuilt_from_messages", queue=queue_id, files=len(files))
    _, write_id, write_count, write_end = files[-1]
    read_id = files[0][1]
    size = sum(f[2] for f in files)
    for _, extra, _, _ in files[1:-1]:
        message_file(folder, extra).unlink(missing_ok=True)
    return QueueState(
        read=Pos(read_id, 0, 0), write=Pos(write_id, write_count, write_end), size=size
    )


def _repair_files(
    queue_id: str, folder: Path, state: QueueState
) -> tuple[QueueState, tuple[str, int] | None]:
    """The state with every missing-file combination repaired, and (file id, unread messages
    the state counted in it) when the write file was missing, for the caller to report."""
    read, write = state.read, state.write
    read_path, write_path = message_file(folder, read.file), message_file(folder, write.file)
    write_exists = write_path.exists()
    read_exists = read_path.exists()
    if read.file != write.file and not read_exists:
        log.warning("read_file_missing", queue=queue_id, file=read.file)
        state = state.evolve(read=Pos(write.file, 0, 0), size=write.msg)
        read, read_exists = state.read, write_exists
    if not write_exists:
        missing = None
        if write.byte > 0:
            # Only the unread ones count: the state line may predate their ACKs.
            lost = write.msg if read.file != write.file else write.msg - read.msg
            missing = (write.file, lost)
            if read.file == write.file:
                state = state.evolve(read=Pos(write.file, 0, 0))
            state = state.evolve(
                write=Pos(write.file, 0, 0), size=max(0, state.size - lost), can_write=True
            )
        return state, missing
    actual = write_path.stat().st_size
    if actual > write.byte:
        with open(write_path, "r+b") as f:
            f.truncate(write.byte)
        log.info(
            "write_file_truncated",
            queue=queue_id,
            file=write.file,
            to=write.byte,
            dropped=actual - write.byte,
        )
    elif actual < write.byte:
        count, end, _ = _scan(write_path)
        log.warning(
            "write_file_short", queue=queue_id, file=write.file, recorded=write.byte, valid=end
        )
        with open(write_path, "r+b") as f:
            f.truncate(end)
        lost = write.msg - count
        state = state.evolve(write=Pos(write.file, count, end), size=max(0, state.size - lost))
        if state.read.file == write.file and state.read.byte > end:
            state = state.evolve(read=Pos(write.file, count, end), size=0)
    return state, None
