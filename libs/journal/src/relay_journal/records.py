"""The journal's on-disk records, each carrying a format version.

Invariants:
- every record ends with (or is framed by) a CRC-32, so a torn or flipped record is detected,
  never misread;
- readers accept every version listed in `*_VERSIONS` and refuse others by name;
- encoding is deterministic: replaying a logged write appends the same bytes.

Formats (version 1):
- message record: `u8 version | u8 flags | u32 body length | u32 crc | 24-byte msg id |
  u64 ts ms | u64 expires ms (0 = never) | body`, crc over everything after it;
- state line: `v1 read=<file>,<msg>,<byte> write=<file>,<msg>,<byte> size=<n> can_write=T|F
  status=active|suspended lsn=<n> crc=<8 hex>` plus newline, crc over the text before ` crc=`;
- log record: `u32 length | u32 crc | u8 version | u8 op | u64 lsn | u8 id length | queue id |
  op fields`, crc over everything after it. MARK records (op 5) carry a mark's key in the queue
  id field and its value as the op field; a CHECKPOINT may carry every mark as a JSON object
  (both added within version 1: logs written before have neither, and read as no marks).
  WRITE_KEYED records (op 6, also added within version 1) are WRITE records whose fields carry
  the send key after the file id (`u8 key length | key`), so a message and the key that names
  its send are durable together (`relay_journal.keys`); logs written before have none.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import NamedTuple

MESSAGE_VERSIONS = frozenset({1})
STATE_VERSIONS = frozenset({1})
LOG_VERSIONS = frozenset({1})

MSG_ID_BYTES = 24
FLAG_QUOTA = 1

_MSG_HEAD = struct.Struct(">BBII")  # version, flags, body length, crc
_MSG_FIXED = struct.Struct(">24sQQ")  # msg id, ts, expires
MSG_HEADER_BYTES = _MSG_HEAD.size + _MSG_FIXED.size
MAX_BODY_BYTES = 16 * 1024 * 1024


class RecordError(ValueError):
    """A record that is torn, corrupt or of an unknown version."""


class Message(NamedTuple):
    # NamedTuple rather than a frozen dataclass: built on every write, and 5x cheaper.
    msg_id: bytes
    ts_ms: int
    expires_ms: int
    body: bytes
    quota: bool = False

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms != 0 and self.expires_ms <= now_ms


def encode_message(message: Message) -> bytes:
    fixed = _MSG_FIXED.pack(message.msg_id, message.ts_ms, message.expires_ms)
    flags = FLAG_QUOTA if message.quota else 0
    crc = zlib.crc32(message.body, zlib.crc32(fixed, flags))
    return _MSG_HEAD.pack(1, flags, len(message.body), crc) + fixed + message.body


def decode_message(data: bytes | memoryview, offset: int = 0) -> tuple[Message, int]:
    """The message at `offset` and the offset after it; `RecordError` if torn or corrupt."""
    end_head = offset + MSG_HEADER_BYTES
    if len(data) < end_head:
        raise RecordError("torn message header")
    version, flags, length, crc = _MSG_HEAD.unpack_from(data, offset)
    if version not in MESSAGE_VERSIONS:
        raise RecordError(f"unknown message record version {version}")
    if length > MAX_BODY_BYTES:
        raise RecordError(f"message body length {length} is out of range")
    end = end_head + length
    if len(data) < end:
        raise RecordError("torn message body")
    fixed = bytes(data[offset + _MSG_HEAD.size : end_head])
    body = bytes(data[end_head:end])
    if zlib.crc32(body, zlib.crc32(fixed, flags)) != crc:
        raise RecordError("message checksum mismatch")
    msg_id, ts, expires = _MSG_FIXED.unpack(fixed)
    return Message(msg_id, ts, expires, body, bool(flags & FLAG_QUOTA)), end


class Pos(NamedTuple):
    """A position in a message file: `msg` messages and `byte` bytes from its start."""

    file: str
    msg: int
    byte: int

    def text(self) -> str:
        return f"{self.file},{self.msg},{self.byte}"


@dataclass(slots=True)
class QueueState:
    """Mutable: owned by one `OpenQueue`, updated in place on the write path."""

    read: Pos
    write: Pos
    size: int
    can_write: bool = True
    suspended: bool = False
    lsn: int = 0

    def evolve(self, **changes: object) -> QueueState:
        return replace(self, **changes)  # type: ignore[arg-type]


_FILE_ID = r"[A-Za-z0-9_-]{1,32}"
_STATE = re.compile(
    rf"^v(?P<v>\d+) read=(?P<rf>{_FILE_ID}),(?P<rm>\d+),(?P<rb>\d+) "
    rf"write=(?P<wf>{_FILE_ID}),(?P<wm>\d+),(?P<wb>\d+) size=(?P<size>\d+) "
    r"can_write=(?P<cw>[TF]) status=(?P<st>active|suspended) lsn=(?P<lsn>\d+)$"
)


def encode_state(state: QueueState) -> bytes:
    text = (
        f"v1 read={state.read.text()} write={state.write.text()} size={state.size} "
        f"can_write={'T' if state.can_write else 'F'} "
        f"status={'suspended' if state.suspended else 'active'} lsn={state.lsn}"
    )
    return f"{text} crc={zlib.crc32(text.encode()):08x}\n".encode()


def decode_state(line: bytes) -> QueueState:
    """One complete state line (with its newline); `RecordError` otherwise."""
    if not line.endswith(b"\n"):
        raise RecordError("torn state line")
    try:
        text, _, crc = line[:-1].decode().rpartition(" crc=")
    except UnicodeDecodeError:
        raise RecordError("state line is not text") from None
    if not text or len(crc) != 8 or f"{zlib.crc32(text.encode()):08x}" != crc:
        raise RecordError("state line checksum mismatch")
    match = _STATE.match(text)
    if match is None:
        version = text.split(" ", 1)[0]
        if (
            version.startswith("v")
            and version[1:].isdigit()
            and int(version[1:]) not in STATE_VERSIONS
        ):
            raise RecordError(f"unknown state line version {version[1:]}")
        raise RecordError("malformed state line")
    g = match.group
    if int(g("v")) not in STATE_VERSIONS:
        raise RecordError(f"unknown state line version {g('v')}")
    return QueueState(
        read=Pos(g("rf"), int(g("rm")), int(g("rb"))),
        write=Pos(g("wf"), int(g("wm")), int(g("wb"))),
        size=int(g("size")),
        can_write=g("cw") == "T",
        suspended=g("st") == "suspended",
        lsn=int(g("lsn")),
    )


class Op(IntEnum):
    WRITE = 1  # fields: u8 file id length | file id | message record
    ACK = 2  # fields: 24-byte msg id | u8 expired
    SUSPEND = 3  # no fields
    DROP = 4  # no fields: the queue folder is removed (delete, or empty and closed)
    MARK = 5  # queue id field = the mark's key; fields: the value, UTF-8
    WRITE_KEYED = 6  # fields: u8 file id length | file id | u8 key length | key | message record
    CHECKPOINT = 9  # queue id empty; every queue's state on disk covers the lsns before it;
    # fields: every mark as a JSON object, or nothing


_LOG_FRAME = struct.Struct(">II")
_LOG_HEAD = struct.Struct(">BBQB")


class LogRecord(NamedTuple):
    op: Op
    lsn: int
    queue: str
    file: str = ""
    message: Message | None = None
    msg_id: bytes = b""
    expired: bool = False
    message_bytes: bytes = b""
    """`encode_message(message)`, computed once by the writer and reused when applying."""
    marks: dict[str, str] | None = None
    """MARK: `{key: value}` of the one mark; CHECKPOINT: every mark."""
    key: bytes = b""
    """WRITE_KEYED: the send key logged with the message (1 to 255 bytes)."""


def encode_log(record: LogRecord) -> bytes:
    queue = record.queue.encode()
    payload = _LOG_HEAD.pack(1, record.op, record.lsn, len(queue)) + queue
    if record.op in (Op.WRITE, Op.WRITE_KEYED):
        assert record.message is not None
        file = record.file.encode()
        data = record.message_bytes or encode_message(record.message)
        key = bytes((len(record.key),)) + record.key if record.op == Op.WRITE_KEYED else b""
        payload = b"".join((payload, bytes((len(file),)), file, key, data))
    elif record.op == Op.ACK:
        payload += record.msg_id + bytes((record.expired,))
    elif record.op == Op.MARK:
        assert record.marks is not None
        payload += record.marks[record.queue].encode()
    elif record.op == Op.CHECKPOINT and record.marks:
        payload += json.dumps(record.marks, separators=(",", ":"), sort_keys=True).encode()
    return _LOG_FRAME.pack(len(payload), zlib.crc32(payload)) + payload


_WRITE_OP = int(Op.WRITE)
_WRITE_KEYED_OP = int(Op.WRITE_KEYED)


_WRITE_HEAD = struct.Struct(">BBQ")  # `_LOG_HEAD` up to the queue's length byte


def write_log_prefix(queue: bytes, file: bytes) -> bytes:
    """The part of a WRITE record that depends only on its queue and file (the write path
    keeps it per queue)."""
    return bytes((len(queue),)) + queue + bytes((len(file),)) + file


def encode_write(
    lsn: int,
    prefix: bytes,
    msg_id: bytes,
    ts_ms: int,
    expires_ms: int,
    body: bytes,
    flags: int,
    key: bytes = b"",
) -> tuple[bytes, bytes]:
    """The write path's fast form of `encode_message` and of `encode_log` of the WRITE (or,
    with a `key`, WRITE_KEYED) record holding it, in one call and without a `Message` (the
    bytes are identical). `prefix` is `write_log_prefix(queue, file)`."""
    fixed = _MSG_FIXED.pack(msg_id, ts_ms, expires_ms)
    crc = zlib.crc32(body, zlib.crc32(fixed, flags))
    message = _MSG_HEAD.pack(1, flags, len(body), crc) + fixed + body
    if key:
        head = _WRITE_HEAD.pack(1, _WRITE_KEYED_OP, lsn)
        payload = b"".join((head, prefix, bytes((len(key),)), key, message))
    else:
        payload = b"".join((_WRITE_HEAD.pack(1, _WRITE_OP, lsn), prefix, message))
    return message, _LOG_FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _decode_write(op: Op, lsn: int, queue: str, payload: bytes, at: int) -> LogRecord:
    """The fields of a WRITE or WRITE_KEYED record, from `at` in its payload (a checksum-valid
    record cut short is a `RecordError`, like any other)."""
    if at >= len(payload):
        raise RecordError("torn write record")
    flen = payload[at]
    try:
        file = payload[at + 1 : at + 1 + flen].decode()
    except UnicodeDecodeError:
        raise RecordError("file id is not UTF-8") from None
    at += 1 + flen
    key = b""
    if op is Op.WRITE_KEYED:
        if at >= len(payload):
            raise RecordError("torn send key")
        klen = payload[at]
        key = payload[at + 1 : at + 1 + klen]
        if not key or len(key) != klen:
            raise RecordError("torn or empty send key")
        at += 1 + klen
    message, _ = decode_message(payload, at)
    return LogRecord(
        op, lsn, queue, file=file, message=message, message_bytes=payload[at:], key=key
    )


def decode_log(data: bytes | memoryview, offset: int) -> tuple[LogRecord, int]:
    if len(data) < offset + _LOG_FRAME.size:
        raise RecordError("torn log frame")
    length, crc = _LOG_FRAME.unpack_from(data, offset)
    start = offset + _LOG_FRAME.size
    end = start + length
    if length < _LOG_HEAD.size or len(data) < end:
        raise RecordError("torn log record")
    payload = bytes(data[start:end])
    if zlib.crc32(payload) != crc:
        raise RecordError("log record checksum mismatch")
    version, op_code, lsn, qlen = _LOG_HEAD.unpack_from(payload)
    if version not in LOG_VERSIONS:
        raise RecordError(f"unknown log record version {version}")
    try:
        op = Op(op_code)
    except ValueError:
        raise RecordError(f"unknown log operation {op_code}") from None
    at = _LOG_HEAD.size
    queue = payload[at : at + qlen].decode()
    at += qlen
    if op is Op.WRITE or op is Op.WRITE_KEYED:
        return _decode_write(op, lsn, queue, payload, at), end
    if op is Op.ACK:
        return LogRecord(
            op,
            lsn,
            queue,
            msg_id=payload[at : at + MSG_ID_BYTES],
            expired=bool(payload[at + MSG_ID_BYTES]),
        ), end
    if op is Op.MARK:
        try:
            return LogRecord(op, lsn, queue, marks={queue: payload[at:].decode()}), end
        except UnicodeDecodeError:
            raise RecordError("mark value is not UTF-8") from None
    if op is Op.CHECKPOINT and at < len(payload):
        try:
            marks = json.loads(payload[at:])
        except ValueError:
            raise RecordError("checkpoint marks are not JSON") from None
        if not isinstance(marks, dict) or not all(isinstance(v, str) for v in marks.values()):
            raise RecordError("checkpoint marks are not an object of strings")
        return LogRecord(op, lsn, queue, marks=marks), end
    return LogRecord(op, lsn, queue), end
