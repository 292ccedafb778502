"""Queue and message ids, and which command partition a queue lives on.

Invariants:
- every id is 24 random bytes from the OS's CSPRNG, written base64url without padding (32 chars);
- a queue's partition is a function of its id bytes alone (`partition_of`), and a queue's sender
  id is drawn until it falls on its recipient id's partition, so a SEND, which names only the
  sender id, reaches the queue-writer that owns the queue. The ids stay unguessable and
  independent apart from sharing one of `partitions` values (log2(partitions) bits), which says
  nothing to whoever does not already hold both.
"""

from __future__ import annotations

import secrets
from typing import NewType

from relay_durable import codec

ID_BYTES = 24
ID_CHARS = 32

QueueId = NewType("QueueId", str)
"""A recipient id: the queue's name in commands, events, the journal and the store log."""
SenderId = NewType("SenderId", str)
Lsn = NewType("Lsn", int)
"""A position in the queue journal's write-ahead log: durable once the journal says so."""
Seq = NewType("Seq", int)
"""A position in the store log (queue records): durable once the store log says so."""
Slot = NewType("Slot", int)
"""An ingress instance's inbox partition: where its replies and pushes go."""
ConnId = NewType("ConnId", str)
"""A WebSocket connection's id at the ingress instance holding it."""


class InvalidId(ValueError):
    pass


b64u = codec.b64u
unb64u = codec.unb64u
"""`relay_durable.codec`'s, under the names the queue code and the ingress use."""


def new_id() -> str:
    return b64u(secrets.token_bytes(ID_BYTES))


def id_bytes(text: str) -> bytes:
    """The 24 bytes of an id, or `InvalidId`."""
    if len(text) != ID_CHARS:
        raise InvalidId(f"ids are {ID_CHARS} base64url characters")
    try:
        return unb64u(text)
    except ValueError:
        raise InvalidId("ids are base64url") from None


def partition_of(any_id: str, partitions: int) -> int:
    return int.from_bytes(id_bytes(any_id)[:4], "big") % partitions


def new_queue_ids(partitions: int) -> tuple[QueueId, SenderId]:
    """A fresh (recipient id, sender id) pair on the same partition (expected `partitions`
    draws of the sender id)."""
    recipient = new_id()
    target = partition_of(recipient, partitions)
    while True:
        sender = new_id()
        if partition_of(sender, partitions) == target:
            return QueueId(recipient), SenderId(sender)
