"""The checkpoint's tail table (`tail.log` in the journal's root): the state of every queue
whose `queue.log` is behind its truth at a checkpoint, with the appends it still buffers.

Why: before it, a checkpoint appended a state line to every queue written since the last one
and wrote its buffered appends (an open, a write and a close per queue, and one more of each
without a pooled handle): ~35 µs a queue, 3 s of the event loop per 64 MiB segment at 100,000
queues written round (issue 18). The table is one sequential file instead; a queue's own
`queue.log` is written when it closes (eviction, idle, shutdown), as before.

Format: `RTT1`, a u32 count of records (a cut at a record's end is told from a shorter
table), then records `u32 length, u32 crc32 of the body, body`; a body is `u16 id length, id, u32
state line length, the state line (records.encode_state), u32 offset, the buffered appends`
(the bytes the queue's write file lacks from that offset on, in its current write file).

Invariants:
- a table is written under a temporary name, made durable by the checkpoint's filesystem flush,
  then renamed over `tail.log` and the folder fsynced, all before the checkpoint's record is
  logged: a table is never half-visible, and the one in force is never older than the last
  durable CHECKPOINT (a crash between the rename and the record leaves a newer table with the
  older segments: its states are newer than those segments' records, which the replay then
  skips by lsn, as it skips records a state line covers);
- an entry wins over the queue's `queue.log` only when its lsn is higher (a queue closed since
  wrote a newer line);
- a damaged record is left out with a warning naming where (never silently): its queue opens
  from its older queue.log, as a queue whose last state line is damaged does.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import structlog

from relay_journal import errors, records
from relay_journal.records import QueueState

TAIL_FILE = "tail.log"
_HEADER = struct.Struct("<II")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_MAGIC = b"RTT1"
_START = len(_MAGIC) + _U32.size
_IOV_MAX = 1024
log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Entry:
    state: QueueState
    unwritten_at: int
    unwritten: bytes


def encode(queue_id: bytes, state_line: bytes, unwritten_at: int, unwritten: bytes) -> bytes:
    body = b"".join(
        (
            _U16.pack(len(queue_id)),
            queue_id,
            _U32.pack(len(state_line)),
            state_line,
            _U32.pack(unwritten_at),
            unwritten,
        )
    )
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode(data: bytes) -> dict[str, bytes]:
    """queue id → its encoded record, checked (decoded lazily by `entry`). A damaged record is
    left out with a warning (its queue opens from its queue.log, older), and one whose length
    cannot be trusted ends the table there."""
    found: dict[str, bytes] = {}
    if data[: len(_MAGIC)] != _MAGIC or len(data) < _START:
        log.warning("tail_table_damaged", at=0, error="no table header", left_out="all")
        return found
    (count,) = _U32.unpack_from(data, len(_MAGIC))
    at = _START
    while at < len(data):
        if at + _HEADER.size > len(data):
            log.warning("tail_table_damaged", at=at, error="torn record header", left_out="rest")
            break
        length, crc = _HEADER.unpack_from(data, at)
        body = data[at + _HEADER.size : at + _HEADER.size + length]
        end = at + _HEADER.size + length
        if len(body) != length:
            log.warning("tail_table_damaged", at=at, error="torn record", left_out="rest")
            break
        try:
            if zlib.crc32(body) != crc:
                raise ValueError("checksum mismatch")
            (id_length,) = _U16.unpack_from(body, 0)
            queue_id = body[2 : 2 + id_length].decode()
        except (ValueError, struct.error) as error:
            log.warning("tail_table_damaged", at=at, error=str(error), left_out="record")
        else:
            found[queue_id] = data[at:end]
        at = end
    if len(found) != count:
        log.warning("tail_table_damaged", records=count, found=len(found), left_out="missing")
    return found


def entry(record: bytes) -> Entry:
    body = memoryview(record)[_HEADER.size :]
    (id_length,) = _U16.unpack_from(body, 0)
    at = 2 + id_length
    (line_length,) = _U32.unpack_from(body, at)
    at += 4
    try:
        state = records.decode_state(bytes(body[at : at + line_length]))
    except records.RecordError as error:
        raise errors.CorruptJournal(f"{TAIL_FILE}: {error}") from None
    at += line_length
    (unwritten_at,) = _U32.unpack_from(body, at)
    return Entry(state, unwritten_at, bytes(body[at + 4 :]))


def load(root: Path) -> dict[str, bytes]:
    try:
        data = (root / TAIL_FILE).read_bytes()
    except FileNotFoundError:
        return {}
    return decode(data)


def write_pending(root: Path, entries: list[bytes]) -> Path:
    """Write the next table under its temporary name (made durable by the caller's flush).
    Gathered writes (`os.writev`), not one joined copy: the table carries up to
    `tail_unwritten_bytes` of buffered appends, and runs on the checkpoint thread."""
    path = root / (TAIL_FILE + ".next")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, [_MAGIC, _U32.pack(len(entries)), *entries])
    finally:
        os.close(fd)
    return path


def _write_all(fd: int, parts: list[bytes]) -> None:
    at = 0
    while at < len(parts):
        batch = parts[at : at + _IOV_MAX]
        written = os.writev(fd, batch)
        at += len(batch)
        wanted = sum(map(len, batch))
        if written < wanted:  # a short write: the rest of this batch, plainly
            rest = memoryview(b"".join(batch))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def install(pending: Path) -> None:
    """Put the durable next table in force (the caller fsyncs the folder)."""
    pending.replace(pending.with_name(TAIL_FILE))
