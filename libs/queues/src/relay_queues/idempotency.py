"""Exactly-once sends: the `Idempotency-Key` rules of API.md and the identity of one send.

Invariants:
- a client key is 1 to 64 characters of `[A-Za-z0-9_-]` (API.md); anything else is refused
  with `ValueError` before any state changes;
- every SEND has exactly one identity, scoped to its sender id: the client's key when it gave
  one, else the msg_id the ingress chose for the command, which a Kafka producer retry
  repeats (so the same record delivered twice is one send). The two forms cannot collide (a
  kind byte separates them), nor can two sender ids' keys;
- an identity is a 16-byte BLAKE2b digest: what the journal logs with the message and keeps
  for the window (`relay_journal.keys`), whatever the key's length.
"""

from __future__ import annotations

import hashlib
import re

from relay_queues import ids

KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
IDENTITY_BYTES = 16
DEFAULT_WINDOW_S = 24 * 3600
"""API.md: a retry within 24 h (configurable) answers the first send."""


def check_key(key: str) -> str:
    """The key if it is well-formed; `ValueError` naming the rule otherwise."""
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError("Idempotency-Key: 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'")
    return key


def identity(sender: ids.SenderId, key: str | None, msg_id: str) -> bytes:
    """The identity of a SEND: its client key's, else its msg_id's, under its sender id."""
    kind, name = (b"k", check_key(key)) if key is not None else (b"m", msg_id)
    digest = hashlib.blake2b(digest_size=IDENTITY_BYTES, person=b"relay-send-key")
    digest.update(b"\n".join((sender.encode(), kind, name.encode())))
    return digest.digest()
