"""Every record Relay puts on Kafka: its schema, version and the topics it may travel on.

Invariants:
- each record is one JSON object with `kind` and `v`; a reader accepts every version it knows and
  rejects any other with a `SchemaError` naming kind and version (never a guess);
- a record's kind is allowed on a fixed set of topics, checked when it is sent;
- records are immutable values; a hop appends to a ping by building a new one.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from relay_bus import topics


class SchemaError(ValueError):
    """A record that this build cannot read."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Hop(_Record):
    """One service's stay in a ping's journey."""

    service: str
    instance: str
    received_ms: float
    sent_ms: float


class _Request(_Record):
    """A record whose answer goes back to the ingress instance that waits for it."""

    id: str
    origin: str
    """Ingress instance that waits for the reply."""
    reply_slot: int = Field(ge=0)
    """The origin's inbox partition."""
    deadline_ms: float
    """Past this time the origin has given up: whoever holds the request drops it."""

    def expired(self, now_ms: float | None = None) -> bool:
        return (now_ms if now_ms is not None else now_ms_()) > self.deadline_ms


class Ping(_Request):
    """The admin ping: ingress → queue-writer → delivery → retainer → replicator → ingress."""

    kind: Literal["ping"] = "ping"
    v: Literal[1] = 1
    started_ms: float
    hops: tuple[Hop, ...] = ()

    def with_hop(self, service: str, instance: str, received_ms: float) -> Ping:
        hop = Hop(service=service, instance=instance, received_ms=received_ms, sent_ms=now_ms_())
        return self.model_copy(update={"hops": (*self.hops, hop)})


class AdminRequest(_Request):
    """An admin operation for every queue-writer (`/admin/dump`, queue stats). The ingress sends
    one copy to each command partition; a queue-writer runs the operation once per `id` and
    answers once per partition it owns, so the asker knows when every owner has answered."""

    kind: Literal["admin"] = "admin"
    v: Literal[1] = 1
    op: Literal["dump", "stats"]
    wait: bool = False
    """For `dump`: answer when the dump is finished (files renamed, old ones removed)."""


class AdminReply(_Record):
    kind: Literal["admin_reply"] = "admin_reply"
    v: Literal[1] = 1
    id: str
    origin: str
    partition: int = Field(ge=0)
    """The command partition this answer covers."""
    instance: str
    result: dict[str, Any]


class InboxClaim(_Record):
    """Written by an ingress instance to its inbox slot when it takes the slot: it reads from
    this record's offset on, so replies meant for an earlier holder are never read."""

    kind: Literal["inbox_claim"] = "inbox_claim"
    v: Literal[1] = 1
    instance: str


class Epoch(_Record):
    """The first record of `relay.epoch`: a broker log's identity (see `relay_bus.bus`)."""

    kind: Literal["epoch"] = "epoch"
    v: Literal[1] = 1
    epoch: str
    created_by: str


Record = Ping | AdminRequest | AdminReply | InboxClaim | Epoch
"""Every record kind; `Reply` the ones an ingress instance waits for."""
Reply = Ping | AdminReply
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Annotated[Record, Field(discriminator="kind")])
_KNOWN_VERSIONS: dict[str, frozenset[int]] = {
    "ping": frozenset({1}),
    "admin": frozenset({1}),
    "admin_reply": frozenset({1}),
    "inbox_claim": frozenset({1}),
    "epoch": frozenset({1}),
}

ALLOWED_TOPICS: dict[str, frozenset[str]] = {
    "ping": frozenset(
        {
            topics.QUEUE_COMMANDS,
            topics.QUEUE_EVENTS,
            topics.PUBLICATIONS,
            topics.REPLICATION,
            topics.INGRESS_INBOX,
        }
    ),
    "admin": frozenset({topics.QUEUE_COMMANDS}),
    "admin_reply": frozenset({topics.INGRESS_INBOX}),
    "inbox_claim": frozenset({topics.INGRESS_INBOX}),
    "epoch": frozenset({topics.EPOCH}),
}


class _Header(BaseModel):
    kind: str
    v: int


def now_ms_() -> float:
    return time.time() * 1000


def encode(record: Record) -> bytes:
    return record.model_dump_json().encode()


def decode(data: bytes | None) -> Record:
    """Parse one record or raise `SchemaError` saying what is wrong with it."""
    if data is None:
        raise SchemaError("empty record")
    try:
        header = _Header.model_validate_json(data, strict=False)
    except ValidationError:
        raise SchemaError("not a Relay record (no kind and v)") from None
    versions = _KNOWN_VERSIONS.get(header.kind)
    if versions is None:
        raise SchemaError(f"unknown record kind {header.kind!r}")
    if header.v not in versions:
        raise SchemaError(
            f"unsupported version {header.v} of {header.kind!r}"
            f" (this build reads {sorted(versions)})"
        )
    try:
        return _ADAPTER.validate_json(data)
    except ValidationError as error:
        raise SchemaError(
            f"invalid {header.kind!r} v{header.v}: {error.errors()[0]['msg']}"
        ) from None


def check_topic(record: Record, topic: str) -> None:
    if topic not in ALLOWED_TOPICS[record.kind]:
        raise ValueError(f"a {record.kind!r} record may not be sent to {topic}")
