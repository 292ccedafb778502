"""The replay of queue and retained state from archived commands and their answers: one pure
function per kind of state, run as is by the plain-Python rebuild and by the Spark jobs (once
per Kafka partition), so both give the same state by construction.

Why commands joined with replies, not commands alone (decision 0012): the queue-writer stamps
`ts` with its own clock, drops commands past their deadline, answers a SEND put on Kafka twice
as the first one, and quotas depend on what was applied before; the reply says what happened.
So a command changes the rebuilt state exactly as its reply says it changed the live one:

- `create` 201: the queue exists (active);
- `send` 201: message `msg_id` appended with the reply's `ts`, expiring `ttl_s` (or the
  default) later, unless the reply names another msg_id (a retry with an `Idempotency-Key`,
  answered with the first send's, stored nothing); 429 `QUOTA`: the quota marker appended
  (its `msg_id` is the refused send's), unless the queue already ends with one;
- `ack` 200/204: message `msg_id` removed (it was the head); `suspend` 200: suspended;
  `delete` 204: the queue and its messages are gone; reads (`info`, `head`, `sub`) change
  nothing that a rebuild keeps (a `head` may drop expired messages: expiry is applied at the
  cut instead);
- any other status changed nothing;
- a command without a reply was never acknowledged: it is *uncertain* (BRIEF §4 protects only
  acknowledged writes), kept apart and not applied; verify explains differences it touches.

Retained messages (per topic, in partition order): a retained `publication` answered 202 sets
the topic's message (payload, ts stamped by the ingress, expiry from `expiry_s`), an empty
payload or a `retained_request` delete answered 204 removes it; unanswered ones are uncertain.

Invariants: a command id is applied at most once (the first copy in partition and offset order;
a producer retry puts a command on Kafka twice); input must come in partition and offset order
per partition (`ReplayOrderError` otherwise); records this build cannot read are counted, never
guessed at. Pure: no I/O, no clock (the cut's time is an argument).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from relay_archive.standing import PublicationCut
from relay_bus import schemas
from relay_queues.writer import DEFAULT_TTL_S


class ReplayOrderError(ValueError):
    pass


@dataclass(frozen=True)
class Answered:
    """One archived request and its reply's bytes (None: no reply archived)."""

    partition: int
    offset: int
    request: bytes
    reply: bytes | None


@dataclass(frozen=True)
class Message:
    queue: str
    msg_id: str
    ts: int | None
    """None for a quota marker (the queue-writer's clock, not in the reply)."""
    expires_ms: int | None
    body: str
    """b64u."""
    quota: bool
    command: str
    """Id of the command that put it there."""
    partition: int
    offset: int


@dataclass(frozen=True)
class Queue:
    queue: str
    sender: str
    recipient_key: str
    status: str
    partition: int


@dataclass(frozen=True)
class Uncertain:
    """A request never answered: it may or may not have been applied."""

    partition: int
    offset: int
    command: str
    op: str
    subject: str
    """Queue id (or sender id for a send; topic for a retained write)."""
    msg_id: str = ""


@dataclass
class QueueState:
    queues: dict[str, Queue] = field(default_factory=dict)
    messages: dict[str, list[Message]] = field(default_factory=dict)
    """Queue → its messages in order."""
    uncertain: list[Uncertain] = field(default_factory=list)
    unreadable: int = 0
    senders: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    position: dict[int, int] = field(default_factory=dict)

    def all_messages(self) -> list[Message]:
        return [m for queue in sorted(self.messages) for m in self.messages[queue]]


def _check_order(position: dict[int, int], item: Answered) -> None:
    if item.offset <= position.get(item.partition, -1):
        raise ReplayOrderError(
            f"partition {item.partition}: offset {item.offset} after {position[item.partition]}"
        )
    position[item.partition] = item.offset


def _decode(data: bytes | None) -> schemas.Record | None:
    try:
        return schemas.decode(data)
    except schemas.SchemaError:
        return None


def replay_queues(answered: Iterable[Answered], state: QueueState | None = None) -> QueueState:
    """Apply commands (queue_cmd records) with their replies, in partition and offset order."""
    state = state or QueueState()
    for item in answered:
        _check_order(state.position, item)
        command = _decode(item.request)
        if not isinstance(command, schemas.QueueCommand):
            state.unreadable += command is None
            continue
        if command.id in state.seen:
            continue
        state.seen.add(command.id)
        reply = _decode(item.reply) if item.reply is not None else None
        if not isinstance(reply, schemas.QueueReply):
            subject = command.sender if isinstance(command, schemas.SendMessage) else command.queue
            msg_id = getattr(command, "msg_id", "")
            state.uncertain.append(
                Uncertain(item.partition, item.offset, command.id, command.op, subject, msg_id)
            )
            continue
        _apply(state, item, command, reply)
    return state


def _apply(
    state: QueueState, item: Answered, command: schemas.QueueCommand, reply: schemas.QueueReply
) -> None:
    status = reply.status
    match command:
        case schemas.CreateQueue() if status == 201 and command.queue not in state.queues:
            state.queues[command.queue] = Queue(
                command.queue, command.sender, command.recipient_key, "active", item.partition
            )
            state.senders[command.sender] = command.queue
            state.messages[command.queue] = []
        case schemas.SendMessage():
            queue = state.senders.get(command.sender)
            if queue is None:
                return
            messages = state.messages[queue]
            if status == 201 and reply.data is not None:
                # A retry answered with an earlier send's msg_id (its Idempotency-Key, decision
                # 0016) stored nothing; so did a producer retry of a message still queued.
                answered = reply.data.get("msg_id", command.msg_id)
                if answered != command.msg_id or any(m.msg_id == command.msg_id for m in messages):
                    return
                ts = int(reply.data["ts"])
                ttl_s = command.ttl_s if command.ttl_s is not None else DEFAULT_TTL_S
                messages.append(
                    Message(
                        queue,
                        command.msg_id,
                        ts,
                        ts + ttl_s * 1000,
                        command.body,
                        False,
                        command.id,
                        item.partition,
                        item.offset,
                    )
                )
            elif status == 429 and reply.code == "QUOTA" and not (messages and messages[-1].quota):
                messages.append(
                    Message(
                        queue,
                        command.msg_id,
                        None,
                        None,
                        "",
                        True,
                        command.id,
                        item.partition,
                        item.offset,
                    )
                )
        case schemas.AckMessage() if status in (200, 204) and command.queue in state.messages:
            messages = state.messages[command.queue]
            state.messages[command.queue] = [m for m in messages if m.msg_id != command.msg_id]
        case schemas.SuspendQueue() if status == 200 and command.queue in state.queues:
            old = state.queues[command.queue]
            state.queues[command.queue] = Queue(
                old.queue, old.sender, old.recipient_key, "suspended", old.partition
            )
        case schemas.DeleteQueue() if status == 204 and command.queue in state.queues:
            old = state.queues.pop(command.queue)
            state.senders.pop(old.sender, None)
            state.messages.pop(command.queue, None)
        case _:
            return


@dataclass(frozen=True)
class RetainedMessage:
    topic: str
    payload: str
    """b64u."""
    ts: int
    expires_ms: int | None
    request: str
    partition: int
    offset: int


@dataclass
class RetainedState:
    topics: dict[str, RetainedMessage] = field(default_factory=dict)
    uncertain: list[Uncertain] = field(default_factory=list)
    unreadable: int = 0
    seen: set[str] = field(default_factory=set)
    position: dict[int, int] = field(default_factory=dict)


class _Requests(Protocol):
    """What `_first_answers` keeps up to date in a replay's state."""

    unreadable: int
    seen: set[str]
    position: dict[int, int]


_RetainerRequest = schemas.Publication | schemas.RetainedRequest | schemas.DsRequest


def _first_answers(
    answered: Iterable[Answered], state: _Requests, wanted: Callable[[_RetainerRequest], bool]
) -> Iterator[tuple[Answered, _RetainerRequest, schemas.DsReply | None]]:
    """The `wanted` retainer requests, each id once, in partition order, with their answer
    (None when none was archived); unreadable records are counted."""
    for item in answered:
        _check_order(state.position, item)
        record = _decode(item.request)
        if record is None:
            state.unreadable += 1
            continue
        if not isinstance(record, _RetainerRequest) or not wanted(record):
            continue
        if record.id in state.seen:
            continue
        state.seen.add(record.id)
        reply = _decode(item.reply) if item.reply is not None else None
        yield item, record, reply if isinstance(reply, schemas.DsReply) else None


def _retained_change(record: _RetainerRequest) -> bool:
    is_publish = isinstance(record, schemas.Publication) and record.retain
    return is_publish or (isinstance(record, schemas.RetainedRequest) and record.op == "delete")


def replay_retained(
    answered: Iterable[Answered],
    state: RetainedState | None = None,
    cut: PublicationCut | None = None,
) -> RetainedState:
    """Apply retained publications and deletes with their answers, in partition order; with
    a retainer's `cut`, only those it says are in (those it is unsure of are uncertain)."""
    state = state or RetainedState()
    for item, record, reply in _first_answers(answered, state, _retained_change):
        assert isinstance(record, schemas.Publication | schemas.RetainedRequest)
        standing = "in" if cut is None else cut.retained(item.partition, item.offset)
        if standing == "out":
            continue
        if reply is None or standing == "uncertain":
            state.uncertain.append(
                Uncertain(item.partition, item.offset, record.id, "retain", record.topic)
            )
            continue
        if isinstance(record, schemas.Publication) and reply.status == 202 and record.payload:
            expires = None if record.expiry_s is None else record.ts + record.expiry_s * 1000
            state.topics[record.topic] = RetainedMessage(
                record.topic,
                record.payload,
                record.ts,
                expires,
                record.id,
                item.partition,
                item.offset,
            )
        elif reply.status in (202, 204):
            state.topics.pop(record.topic, None)
    return state


@dataclass(frozen=True)
class StreamMessage:
    """One acknowledged durable-stream message (a message of an answered `store` request)."""

    db: str
    topic: str
    ts: int
    payload: str
    """b64u."""
    request: str
    partition: int
    offset: int


@dataclass
class StreamState:
    messages: list[StreamMessage] = field(default_factory=list)
    """In partition and offset order, each request's messages in its order."""
    uncertain: list[Uncertain] = field(default_factory=list)
    unreadable: int = 0
    unstamped: int = 0
    """Acknowledged messages without `ts` (written before the ingress stamped every write: the
    retainer's clock gave them their ts, which the archive does not hold); not rebuilt."""
    seen: set[str] = field(default_factory=set)
    position: dict[int, int] = field(default_factory=dict)


def _stream_write(record: _RetainerRequest) -> bool:
    return isinstance(record, schemas.DsRequest) and record.op == "store"


def replay_streams(
    answered: Iterable[Answered],
    state: StreamState | None = None,
    cut: PublicationCut | None = None,
) -> StreamState:
    """Collect durable-stream writes (`ds_request` `store`) with their answers, in partition
    order: a write answered 201 adds its messages, one never answered is uncertain, a refused
    one adds nothing. With a retainer's `cut`, each message stands on its own shard's
    position: only those in are added; a write with a message the cut is unsure of is
    uncertain; one whose messages are all out is left out."""
    state = state or StreamState()
    for item, record, reply in _first_answers(answered, state, _stream_write):
        assert isinstance(record, schemas.DsRequest)
        standings = [
            "in" if cut is None else cut.stream(item.partition, item.offset, record.db, m.topic)
            for m in record.messages
        ]
        if not record.messages and cut is not None:
            standings = [cut.standing(item.partition, item.offset, "")]
        if standings and all(s == "out" for s in standings):
            continue
        if reply is None or "uncertain" in standings:
            state.uncertain.append(
                Uncertain(item.partition, item.offset, record.id, "stream", record.db)
            )
            continue
        if reply.status != 201:
            continue
        for message, standing in zip(record.messages, standings, strict=True):
            if standing == "out":
                continue
            if message.ts is None:
                state.unstamped += 1
                continue
            state.messages.append(
                StreamMessage(
                    record.db,
                    message.topic,
                    message.ts,
                    message.payload,
                    record.id,
                    item.partition,
                    item.offset,
                )
            )
    return state
