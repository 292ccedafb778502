"""Store log lines: one versioned, checksummed record per line, in logs and dumps alike.

Line format (version 1): `v1 <kind> <json object> <crc32 as 8 hex digits>` and a newline, the
checksum over everything before its separating space. Kinds: `new` (a queue record), `status`,
`delete`, `offsets` (Kafka offsets the queue-writer has applied, with the broker epoch).
Invariant: a line either decodes to exactly what was encoded or raises `LineError` saying why.
"""

from __future__ import annotations

import zlib
from typing import Any, NamedTuple

import orjson

VERSIONS = frozenset({1})
KINDS = frozenset({"new", "status", "delete", "offsets"})
STATUSES = frozenset({"active", "suspended"})


class LineError(ValueError):
    pass


class QueueRecord(NamedTuple):
    recipient_id: str
    sender_id: str
    recipient_key: str
    """b64url Ed25519 public key."""
    quota: int
    created_at: int
    """Unix ms."""
    updated_at: int
    status: str = "active"


class Line(NamedTuple):
    kind: str
    data: dict[str, Any]


def encode(kind: str, data: dict[str, Any]) -> bytes:
    # orjson: compact and sorted, byte for byte what json.dumps(separators=(",", ":"),
    # sort_keys=True) gave for these ASCII records, and several times faster to read back
    # (restore decodes every record of the dump).
    body = b"v1 " + kind.encode() + b" " + orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    return body + f" {zlib.crc32(body):08x}\n".encode()


def decode(raw: bytes) -> Line:
    if not raw.endswith(b"\n"):
        raise LineError("torn record (no end of line)")
    body, _, crc = raw[:-1].rpartition(b" ")
    if len(crc) != 8 or f"{zlib.crc32(body):08x}".encode() != crc:
        raise LineError("checksum mismatch")
    parts = body.split(b" ", 2)
    if len(parts) != 3:
        raise LineError("malformed record")
    try:
        version, kind = parts[0].decode(), parts[1].decode()
    except UnicodeDecodeError:
        raise LineError("malformed record") from None
    if not version.startswith("v") or not version[1:].isdigit() or int(version[1:]) not in VERSIONS:
        raise LineError(f"unknown record version {version!r}")
    if kind not in KINDS:
        raise LineError(f"unknown record kind {kind!r}")
    try:
        data = orjson.loads(parts[2])
    except orjson.JSONDecodeError:
        raise LineError("malformed record data") from None
    if not isinstance(data, dict):
        raise LineError("malformed record data")
    return Line(kind, data)


def queue_to_data(record: QueueRecord) -> dict[str, Any]:
    return record._asdict()


def queue_from_data(data: dict[str, Any]) -> QueueRecord:
    try:
        record = QueueRecord(**data)
    except TypeError:
        raise LineError("queue record has wrong fields") from None
    if record.status not in STATUSES or not isinstance(record.quota, int):
        raise LineError("queue record has invalid values")
    return record
