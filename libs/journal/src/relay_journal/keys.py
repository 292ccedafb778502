"""Send keys: which message a send key (a caller's name for one send) stored first, for a window.

Invariants:
- a key reaches the journal only in the WAL record of its message (`Op.WRITE_KEYED`): the
  message is never durable without its key, nor the key without its message;
- a checkpoint appends the keys logged since the previous one (`pending`) to the key file of
  their time bucket before the filesystem flush that precedes the WAL's retirement, so every
  durable key is in a key file or in the WAL, and an open that loads the files and replays the
  WAL knows them all (a crash between the two leaves a key in both: loading it twice is
  harmless);
- `get` answers a key only within `window_ms` of its message's timestamp; past it the key is
  forgotten: dropped from memory as later keys arrive (`prune`), and its key file deleted at
  the first checkpoint after the file's whole bucket is past the window. Memory and disk hold
  the keys of one window, whatever the number of queues.

Key files: `keys/keys-<first ms>-<end ms>.log`, a sequence of blocks, one per checkpoint and
key length: `u32 length | u32 crc | u8 version | u8 key length | entries`, each entry `key |
24-byte msg id | u64 ts ms`, crc over what follows it. One crc per block rather than per key:
a restart reads a million keys in about a second (`struct.iter_unpack`), not ten. A reader
stops at the first torn or corrupt block of a file (logged) and the file is cut there at open:
a torn tail comes from a crash inside a checkpoint, whose keys the WAL still holds; the keys
after a corrupt block are lost, so a retry of those sends would store a second copy.

In memory each key maps to its msg id and timestamp packed in one 32-byte `bytes` (a tuple of
both cost ~90 bytes more per key).

Rejected: carrying every key in each checkpoint record, as marks are (a day's keys rewritten
with every 64 MiB segment), and keeping keys in the store log (a second file with its own
fsync: a kill between the two fsyncs would leave a message durable without its key).
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections import deque
from pathlib import Path
from typing import NamedTuple

import structlog

log = structlog.get_logger(__name__)

KEYS_DIR = "keys"
KEY_VERSIONS = frozenset({1})
MAX_KEY_BYTES = 255
BUCKETS_PER_WINDOW = 24
"""Key files per window (one an hour for a day): a file is deleted at most a bucket late."""
_FILE = re.compile(r"^keys-(\d{1,20})-(\d{1,20})\.log$")
_FRAME = struct.Struct(">II")
_VALUE = struct.Struct(">24sQ")


class Sent(NamedTuple):
    """What a send key answers: the first message's id and timestamp."""

    msg_id: bytes
    ts_ms: int


def _ts(value: bytes) -> int:
    return int.from_bytes(value[24:], "big")


def encode_block(key_bytes: int, entries: list[tuple[bytes, bytes]]) -> bytes:
    """One block of (key, packed value) entries whose keys are all `key_bytes` long."""
    payload = b"".join((bytes((1, key_bytes)), *(key + value for key, value in entries)))
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def encode_key(key: bytes, sent: Sent) -> bytes:
    """A block holding one key."""
    return encode_block(len(key), [(key, _VALUE.pack(*sent))])


def decode_keys(data: bytes, name: str = "") -> tuple[list[tuple[bytes, Sent]], int]:
    """Every key of a key file's valid blocks, up to the first torn or corrupt one (logged),
    and the length of the valid part."""
    packed, valid = _decode_packed(data, name)
    return [(key, Sent(*_VALUE.unpack(value))) for key, value in packed], valid


def _decode_packed(data: bytes, name: str) -> tuple[list[tuple[bytes, bytes]], int]:
    found: list[tuple[bytes, bytes]] = []
    at = 0
    while at < len(data):
        problem = ""
        if len(data) < at + _FRAME.size:
            problem = "torn frame"
        else:
            length, crc = _FRAME.unpack_from(data, at)
            payload = data[at + _FRAME.size : at + _FRAME.size + length]
            if len(payload) != length or length < 2:
                problem = "torn block"
            elif zlib.crc32(payload) != crc:
                problem = "checksum mismatch"
            elif payload[0] not in KEY_VERSIONS:
                problem = f"unknown key block version {payload[0]}"
            elif payload[1] == 0 or (length - 2) % (payload[1] + _VALUE.size):
                problem = "malformed key block"
        if problem:
            log.warning("key_file_tail_ignored", file=name, offset=at, error=problem)
            break
        klen = payload[1]
        found.extend(
            (entry[:klen], entry[klen:])
            for (entry,) in struct.iter_unpack(f">{klen + _VALUE.size}s", payload[2:])
        )
        at += _FRAME.size + length
    return found, at


class SentKeys:
    """The send-key index of one journal: in memory for lookups, in key files for restarts."""

    def __init__(self, root: Path, window_ms: int) -> None:
        if window_ms < 1:
            raise ValueError("the send key window must be positive")
        self.folder = root / KEYS_DIR
        self.window_ms = window_ms
        self.bucket_ms = max(1000, window_ms // BUCKETS_PER_WINDOW)
        self._index: dict[bytes, bytes] = {}
        """Key → msg id and timestamp, packed (`_VALUE`)."""
        self._order: deque[bytes] = deque()
        """Keys in the order they were added (timestamp order, but for clock steps)."""
        self.pending: list[tuple[bytes, bytes]] = []
        """Keys logged since the last `persist` (in the WAL only), with their packed values."""

    def __len__(self) -> int:
        return len(self._index)

    def get(self, key: bytes, now_ms: int) -> Sent | None:
        value = self._index.get(key)
        if value is None or _ts(value) + self.window_ms <= now_ms:
            return None
        return Sent(*_VALUE.unpack(value))

    def add(self, key: bytes, sent: Sent) -> None:
        """Remember a key just logged with its message (or replayed from the WAL)."""
        if not 0 < len(key) <= MAX_KEY_BYTES:
            raise ValueError(f"send keys are 1 to {MAX_KEY_BYTES} bytes")
        value = _VALUE.pack(*sent)
        if self._index.get(key) == value:
            return  # replayed from a WAL whose keys a crashed checkpoint had already saved
        self._index[key] = value
        self._order.append(key)
        self.pending.append((key, value))
        self.prune(sent.ts_ms)

    def prune(self, now_ms: int) -> None:
        """Forget keys past the window, oldest first (amortised O(1) per key added)."""
        index, order, horizon = self._index, self._order, now_ms - self.window_ms
        while order:
            value = index.get(order[0])
            if value is not None and _ts(value) > horizon:
                break
            key = order.popleft()
            if value is not None:
                del index[key]

    def load(self, now_ms: int) -> None:
        """Read the key files (at open, before the WAL replay), oldest bucket first, deleting
        expired ones."""
        index, order, horizon = self._index, self._order, now_ms - self.window_ms
        files = sorted(self._files(), key=lambda file: file[1])
        for path, end_ms in files:
            if end_ms <= horizon:
                path.unlink(missing_ok=True)
                continue
            data = path.read_bytes()
            found, valid = _decode_packed(data, path.name)
            if valid < len(data):
                # A torn append (a crash in a checkpoint: the WAL still holds those keys) or a
                # corrupt block: later appends must not land behind unreadable bytes.
                os.truncate(path, valid)
            for key, value in found:
                if _ts(value) > horizon:
                    index[key] = value
                    order.append(key)
        log.info("send_keys_loaded", keys=len(index), files=len(files))

    def _files(self) -> list[tuple[Path, int]]:
        """(path, end of its bucket in ms) of every key file."""
        if not self.folder.is_dir():
            return []
        return [
            (self.folder / name, int(match.group(2)))
            for name in os.listdir(self.folder)
            if (match := _FILE.match(name))
        ]

    def persist(self, now_ms: int) -> None:
        """Append the pending keys to their bucket files, one block per bucket and key length
        (made durable by the caller's filesystem flush), and delete the files past the
        window."""
        self.prune(now_ms)
        if self.pending:
            self.folder.mkdir(exist_ok=True)
            blocks: dict[tuple[int, int], list[tuple[bytes, bytes]]] = {}
            for key, value in self.pending:
                blocks.setdefault((_ts(value) // self.bucket_ms, len(key)), []).append((key, value))
            for (bucket, key_bytes), entries in blocks.items():
                first = bucket * self.bucket_ms
                path = self.folder / f"keys-{first}-{first + self.bucket_ms}.log"
                with path.open("ab") as file:
                    file.write(encode_block(key_bytes, entries))
            self.pending = []
        for path, end_ms in self._files():
            if end_ms + self.window_ms <= now_ms:
                path.unlink(missing_ok=True)
