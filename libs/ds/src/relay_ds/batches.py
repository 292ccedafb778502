"""A durable-stream write (`POST /v1/ds/{db}/messages`): the batch checked against its limits,
then split by the partition whose retainer owns each topic, so that each part can be sent to
its owner alone.

Checked, in this order, so that the first problem is the one reported: the batch is not empty
(`Refused`) and within `BatchLimits.messages` (`TooLarge`); then message by message, its topic
(`Refused`), its payload's base64url (`Refused`) and decoded size (`TooLarge`); last the batch's
bytes of topics (UTF-8) and decoded payloads (`TooLarge`).

Invariants:
- every message is in exactly one part, the part of `owner(topic)`, so a topic's messages
  always go to one retainer;
- parts come in partition order and keep the batch's order within each part;
- a refused batch yields no part: nothing of it is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from relay_ds.errors import Refused, TooLarge
from relay_durable import codec
from relay_topics import rules as topic_rules


@dataclass(frozen=True)
class BatchLimits:
    messages: int
    """Most messages in one batch."""
    bytes: int
    """Most bytes of topics (UTF-8) and decoded payloads in one batch."""
    payload_bytes: int
    """Most bytes of one decoded payload."""


class NewMessage(Protocol):
    """A message to store, as the client sent it (payload in base64url)."""

    @property
    def topic(self) -> str: ...

    @property
    def payload(self) -> str: ...


M = TypeVar("M", bound=NewMessage)


def split(
    batch: Sequence[M], limits: BatchLimits, owner: Callable[[str], int]
) -> dict[int, list[M]]:
    """The batch's messages by owning partition (`owner` of the topic), once the whole batch
    passed the checks above; `Refused` or `TooLarge` naming the first problem otherwise."""
    if not batch:
        raise Refused("a batch needs at least one message")
    if len(batch) > limits.messages:
        raise TooLarge(f"over {limits.messages} messages in one batch")
    parts: dict[int, list[M]] = {}
    total = 0
    for i, message in enumerate(batch):
        try:
            topic_rules.parse_topic(message.topic)
        except topic_rules.TopicError as error:
            raise Refused(f"{i}.topic: {error}") from None
        try:
            size = len(codec.unb64u(message.payload))
        except ValueError:
            raise Refused(f"{i}.payload: not base64url") from None
        if size > limits.payload_bytes:
            raise TooLarge(f"{i}.payload: over {limits.payload_bytes} bytes")
        total += size + len(message.topic.encode())
        parts.setdefault(owner(message.topic), []).append(message)
    if total > limits.bytes:
        raise TooLarge(f"batch over {limits.bytes} bytes of topics and payloads")
    return dict(sorted(parts.items()))
