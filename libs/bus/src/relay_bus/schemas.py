"""Every record Relay puts on Kafka: its schema, version and the topics it may travel on.

Invariants:
- each record is one JSON object with `kind` and `v`; a reader accepts every version it knows and
  rejects any other with a `SchemaError` naming kind and version (never a guess);
- a record's kind is allowed on a fixed set of topics, checked when it is sent;
- records are immutable values; a hop appends to a ping by building a new one.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, ValidationError

from relay_bus import topics
from relay_queues.delivery import Head
from relay_queues.ids import ConnId, Lsn, Slot


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
    reply_slot: Slot = Field(ge=0)
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
    """An admin operation for every queue-writer (`/admin/dump`, `/admin/export`, queue
    stats). The ingress sends one copy to each command partition; a queue-writer runs the
    operation once per `id` and answers once per partition it owns, so the asker knows when
    every owner has answered."""

    kind: Literal["admin"] = "admin"
    v: Literal[1] = 1
    op: Literal["dump", "stats", "export"]
    wait: bool = False
    """For `dump`: answer when the dump is finished (files renamed, old ones removed)."""


class AdminReply(_Record):
    """An owner's answer to an `AdminRequest`, for one partition: its `result` is the
    `AdminAnswer` model of the operation asked (`DumpStarted`, `DumpFinished`,
    `QueueWriterStats`, `QueuePart`, `RetainerPart`), read with `answer`."""

    kind: Literal["admin_reply"] = "admin_reply"
    v: Literal[1] = 1
    id: str
    origin: str
    partition: int = Field(ge=0)
    """The command partition this answer covers."""
    instance: str
    result: dict[str, Any]

    def answer(self, model: type[AnswerT]) -> AnswerT:
        """The result as `model`, or `SchemaError` when the owner answered in another shape."""
        found = _answer(self.kind, self.result, model)
        assert found is not None  # a result is required
        return found


class _QueueCommand(_Request):
    """A client's queue request, for the queue-writer owning the queue's partition (see
    `relay_queues.ids.partition_of`); answered with a `QueueReply`. One model per operation
    (v2); v1 records (one model for every operation) are still read, as `QueueCommandV1`."""

    kind: Literal["queue_cmd"] = "queue_cmd"
    v: Literal[2] = 2


class CreateQueue(_QueueCommand):
    op: Literal["create"] = "create"
    queue: str
    """Recipient id, chosen by the ingress."""
    sender: str
    recipient_key: str
    """b64u Ed25519 public key."""


class SendMessage(_QueueCommand):
    op: Literal["send"] = "send"
    sender: str
    msg_id: str
    """The id the ingress chose."""
    body: str
    """b64u."""
    ttl_s: int | None = None
    key: str | None = None
    """The client's `Idempotency-Key`, if it sent one (added within v2: records without it
    still decode). The queue-writer stores a send once per key, else once per msg_id
    (`relay_queues.idempotency`)."""


class _RecipientCommand(_QueueCommand):
    """A recipient's command: `signed` is the text the ingress built from the request, `sig`
    the client's b64u Ed25519 signature of it."""

    queue: str
    signed: str
    sig: str


class ReadInfo(_RecipientCommand):
    op: Literal["info"] = "info"


class ReadHead(_RecipientCommand):
    op: Literal["head"] = "head"


class AckMessage(_RecipientCommand):
    op: Literal["ack"] = "ack"
    msg_id: str


class SuspendQueue(_RecipientCommand):
    op: Literal["suspend"] = "suspend"


class DeleteQueue(_RecipientCommand):
    op: Literal["delete"] = "delete"


class SubscribeQueue(_RecipientCommand):
    op: Literal["sub"] = "sub"
    slot: Slot = Field(ge=0)
    """The inbox slot of the ingress holding the connection; `conn` its id there."""
    conn: ConnId


QueueCommand = (
    CreateQueue
    | SendMessage
    | ReadInfo
    | ReadHead
    | AckMessage
    | SuspendQueue
    | DeleteQueue
    | SubscribeQueue
)
RecipientCommand = ReadInfo | ReadHead | AckMessage | SuspendQueue | DeleteQueue | SubscribeQueue
_QUEUE_COMMANDS: dict[str, type[_QueueCommand]] = {
    cls.model_fields["op"].default: cls for cls in get_args(QueueCommand)
}


class QueueCommandV1(_Request):
    """Version 1 of `queue_cmd`: every operation in one model, unused fields empty. Read (and
    upgraded) only; this build writes v2."""

    kind: Literal["queue_cmd"] = "queue_cmd"
    v: Literal[1] = 1
    op: Literal["create", "send", "info", "head", "ack", "suspend", "delete", "sub"]
    queue: str = ""
    sender: str = ""
    recipient_key: str = ""
    msg_id: str = ""
    body: str = ""
    ttl_s: int | None = None
    signed: str = ""
    sig: str = ""
    slot: int | None = None
    conn: str = ""

    def upgrade(self) -> QueueCommand:
        """The same command as its v2 model (which checks the fields its operation needs)."""
        model = _QUEUE_COMMANDS[self.op]
        fields = self.model_dump(exclude={"kind", "v"})
        wanted = {k: v for k, v in fields.items() if k in model.model_fields}
        upgraded: QueueCommand = model.model_validate(wanted)  # type: ignore[assignment]
        return upgraded


class _Answer(BaseModel):
    """The body of an accepted reply (`QueueReply`, `DsReply`, `KvReply`; an `AdminReply`'s
    result), as API.md shows it to the client: the service that answers builds it, the ingress
    reads it back with the reply's `answer` (any other shape refused) and answers with it (its
    response models, but for `Subscribed`; a `KvAnswer` as its JSON body; an `AdminAnswer`
    inside the report that names each owner), so the shape is stated once."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class QueueCreated(_Answer):
    recipient_id: str
    sender_id: str
    quota: int


class Sent(_Answer):
    msg_id: str
    ts: int


class QueueInfo(_Answer):
    size: int
    quota: int
    status: str
    created_at: int


class QueueMessage(_Answer):
    """A queue's head message (`relay_queues.delivery.Head.frame()`): a body, or the quota
    marker."""

    msg_id: str
    ts: int
    body: str | None = None
    quota: bool | None = None


class Subscribed(_Answer):
    """A SUB accepted: the queue-writer's order of it (`QueueEvent.since`)."""

    since: int = Field(ge=0)


AnswerT = TypeVar("AnswerT")


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _answer(kind: str, data: dict[str, Any] | None, model: type[AnswerT]) -> AnswerT | None:
    """A reply's body as `model` (an `_Answer`, or a dataclass such as
    `relay_ds.info.Description`), None when it has none, or `SchemaError` when the service
    answered in another shape (never a half-read value)."""
    if data is None:
        return None
    adapter = _ADAPTERS.get(model)
    if adapter is None:
        adapter = _ADAPTERS[model] = TypeAdapter(model)
    try:
        value: AnswerT = adapter.validate_python(data)
        return value
    except ValidationError as error:
        raise SchemaError(f"{kind} data is not a {model.__name__}: {error}") from None


class AdminAnswer(_Answer):
    """The result of an admin operation at one owner (`AdminReply.answer`); the ingress
    reports it with the owner's instance and partitions (`relay_ingress.admin`)."""


class DumpStarted(AdminAnswer):
    """`dump`: N of `store-(N).dump`, the dump started or the one already running."""

    dump: int


class DumpFinished(AdminAnswer):
    """`dump` with `wait`: the finished dump."""

    dump: int
    records: int
    """Queue records in the dump."""
    bytes: int
    pause_ms: float
    """How long changes waited while the snapshot was taken."""
    total_s: float


class QueueWriterStats(AdminAnswer):
    """`stats`: one queue-writer's queues."""

    queues: int
    """Queue records in the store log."""
    messages: int
    """Messages waiting in the queues (quota markers included)."""
    bytes: int
    """Bytes of those messages' records in the message files."""
    open_queues: int
    """Queues with state in memory now."""


class QueuePart(AdminAnswer):
    """`export` at a queue-writer: the part it wrote and its exact cut."""

    folder: str
    epoch: str
    at_ms: int
    offsets: dict[str, int]
    """Command partition → first offset not applied."""
    queues: int
    messages: int
    early: int
    """Queues read ahead of the slices because a command was about to change them."""
    longest_ms: float
    read_s: float
    total_s: float


class RetainerPart(AdminAnswer):
    """`export` at a retainer: the part it wrote and its cut (`relay_retainer.exports`). The
    fields with defaults came later: an older retainer's answer is still read."""

    folder: str
    epoch: str
    at_ms: int
    publications: dict[str, int]
    publications_upto: dict[str, int]
    stores: dict[str, dict[str, int]] = {}
    exact: bool = False
    retained: int
    streams: int
    pause_ms: float
    writes_during: int = 0
    before_ms: float = 0.0
    total_s: float


class QueueReply(_Record):
    kind: Literal["queue_reply"] = "queue_reply"
    v: Literal[1] = 1
    id: str
    origin: str
    status: int
    data: dict[str, Any] | None = None
    """The answer's body (one of the `_Answer` models, read with `answer`); None for none."""
    code: str | None = None
    detail: str = ""

    def answer(self, model: type[AnswerT]) -> AnswerT | None:
        """The body as the model of the command that was asked, or `SchemaError` when the
        queue-writer answered in another shape (never a half-read value)."""
        return _answer(self.kind, self.data, model)


class QueueResync(_Record):
    """From delivery: tell me queue's head for this subscriber (delivery rebuilds its state)."""

    kind: Literal["queue_resync"] = "queue_resync"
    v: Literal[1] = 1
    queue: str
    slot: Slot = Field(ge=0)
    conn: ConnId
    since: int = Field(0, ge=0)
    """The subscriber's SUB order as the registry holds it, echoed in the `subscribed` event."""


class QueueEvent(_Record):
    """What a queue-writer did to a queue, for delivery (`relay_queues.delivery`); or, with
    `event="unsubscribed"`, an ingress saying a subscriber's connection closed; with
    `event="registered"`, an ingress saying it recorded an accepted SUB in the registry; with
    `event="writer_started"` (queue empty), a queue-writer saying it started on this partition
    (events it had not sent yet may be lost: delivery resyncs the partition)."""

    kind: Literal["queue_event"] = "queue_event"
    v: Literal[1] = 1
    event: Literal[
        "changed", "read", "subscribed", "deleted", "unsubscribed", "registered", "writer_started"
    ]
    queue: str
    lsn: Lsn = Lsn(0)
    head: Head | None = None
    slot: Slot | None = None
    conn: ConnId = ConnId("")
    since: int = Field(0, ge=0)
    """`subscribed`, `registered`: the queue-writer's order of the SUB (later SUBs, larger)."""


class Deliver(_Record):
    """From delivery to the ingress instance holding a subscriber's connection."""

    kind: Literal["deliver"] = "deliver"
    v: Literal[1] = 1
    frame: Literal["MSG", "END"]
    conn: ConnId
    queue: str
    head: Head | None = None


class DsMessage(_Record):
    """One message of a durable-stream write or read (API.md, Durable streams)."""

    topic: str
    payload: str
    """b64u."""
    ts: int | None = None
    """Unix ms; on a write, None lets the store's clock stamp it."""


class DsRequest(_Request):
    """A durable-stream request for the retainer owning a partition of `relay.publications`
    (`relay_bus.routing`). `store`, `iterator` and `next` go to one partition; `streams`,
    `describe` and the replica and site changes go to every partition, and each retainer runs
    them once per `id`, answering once per partition it owns (with data on its lowest one)."""

    kind: Literal["ds_request"] = "ds_request"
    v: Literal[1] = 1
    op: Literal[
        "store",
        "streams",
        "iterator",
        "next",
        "describe",
        "set_replicas",
        "join",
        "leave",
        "forget",
    ]
    db: str = ""
    messages: tuple[DsMessage, ...] = ()
    """`store`: every message's topic belongs to the partition the request was sent to."""
    filter: str = ""
    start: int = Field(0, ge=0)
    """Unix ms: `streams` and `iterator` consider messages with ts >= start."""
    stream: str = ""
    """`iterator`: the store's opaque stream string (without the partition address)."""
    iterator: str = ""
    """`next`: the store's opaque iterator string (without the partition address)."""
    n: int = Field(0, ge=0)
    """`next`: at most this many messages."""
    sites: tuple[str, ...] = ()
    """`set_replicas`: the new replica set."""
    site: str = ""
    """`join`, `leave`, `forget`."""
    peers: dict[str, str] = Field(default_factory=dict)
    """Replica changes: every site known to some retainer (site -> node), registered by each
    retainer that does not know it yet, so that every retainer accepts the same replica set."""


class Publication(_Request):
    """A publish (`POST /v1/publish`, WebSocket PUBLISH) on the partition of
    `relay.publications` that owns its topic (`relay_bus.routing.partition_of_topic`). The
    retainer owning it keeps it when `retain` (an empty payload deletes the topic's retained
    message) and answers with a `DsReply` once durable; delivery routes it to the live
    subscribers whose filter matches. A publish that is not retained is not answered."""

    kind: Literal["publication"] = "publication"
    v: Literal[1] = 1
    topic: str
    payload: str
    """b64u; empty with `retain` deletes the retained message."""
    ts: int = Field(ge=0)
    """Unix ms, stamped by the ingress (the retained message's ts)."""
    retain: bool = False
    expiry_s: int | None = Field(None, ge=1, le=2**32 - 1)
    """Seconds until the retained message expires (MQTT 5 Message Expiry Interval)."""


class RetainedRequest(_Request):
    """A read or an admin change of retained messages, answered with a `DsReply`. `read` and
    `delete` go to the partition owning `topic` (a delete is ordered with that topic's
    publications); `match` and `size` go to every partition, each retainer answering once per
    partition it owns with its data on its lowest one."""

    kind: Literal["retained_request"] = "retained_request"
    v: Literal[1] = 1
    op: Literal["read", "match", "size", "delete"]
    topic: str = ""
    filter: str = ""
    after: str | None = None
    """`match`: only topics after this one, in the retained store's topic order."""
    limit: int = Field(0, ge=0, le=10_000)
    """`match`: at most this many messages (an answer may stop earlier, by size)."""
    keys_only: bool = False
    """`match`: topics only, no payloads (to walk past earlier pages)."""


class TopicSubscription(_Record):
    """An ingress telling delivery that a WebSocket connection subscribed to a topic filter
    (`add`), no longer does (`remove`), or that every subscription of an inbox slot is gone
    (`drop_slot`: a new holder took the slot). Sent to every partition of
    `relay.publications`, so each partition's publications are matched against the
    subscriptions in force at that point of its log."""

    kind: Literal["topic_sub"] = "topic_sub"
    v: Literal[1] = 1
    op: Literal["add", "remove", "drop_slot"]
    slot: Slot = Field(ge=0)
    conn: ConnId = ConnId("")
    filter: str = ""


class Fanout(_Record):
    """From delivery to one ingress instance: a live publication for its connections `conns`
    (each subscribed to a filter matching `topic`)."""

    kind: Literal["fanout"] = "fanout"
    v: Literal[1] = 1
    conns: tuple[ConnId, ...]
    topic: str
    payload: str
    """b64u."""
    ts: int


# The bodies of the retainer's answers (`DsReply.answer`). Most are also the API's response
# models, whose class docstring would become the OpenAPI description: those say in a comment
# which operation they answer.


class Stored(_Answer):
    # `store`: messages made durable.
    stored: int


class RankedStream(_Answer):
    rank: tuple[int, int]
    """(X, Y): streams with different X may be replayed in parallel; with the same X, in order
    of Y (seed 003)."""
    stream: str


class StreamsFound(_Answer):
    """`streams`: one part of one retainer's streams (each part of a long answer is one)."""

    streams: list[RankedStream]


class IteratorMade(_Answer):
    # `iterator`.
    iterator: str


class StoredMessage(_Answer):
    topic: str
    payload: str
    """b64u."""
    ts: int


class NextMessages(_Answer):
    # `next`.
    messages: list[StoredMessage]
    iterator: str
    end_of_stream: bool


class RetainedMessage(_Answer):
    # A retained `read`, and each message of a `match`.
    topic: str
    payload: str
    """b64u."""
    ts: int
    expires_at: int | None


class RetainedMatch(_Answer):
    """A retained `match`: up to `limit` messages in the retained store's topic order, and
    whether more follow."""

    messages: list[RetainedMessage]
    more: bool


class RetainedTopic(_Answer):
    topic: str


class RetainedTopics(_Answer):
    """A retained `match` with `keys_only`: topics only."""

    messages: list[RetainedTopic]
    more: bool


class RetainedSize(_Answer):
    # A retained `size`.
    size: int


class DsReply(_Record):
    """A retainer's answer to a `DsRequest`, a `RetainedRequest` or a retained `Publication`,
    for one partition; a long answer (many streams) comes in `parts` records, numbered by
    `part`. Its body is the `_Answer` model of the operation asked (`describe`:
    `relay_ds.info.Description`; writes and admin changes: none), read with `answer`."""

    kind: Literal["ds_reply"] = "ds_reply"
    v: Literal[1] = 1
    id: str
    origin: str
    partition: int = Field(ge=0)
    instance: str
    site: str
    status: int
    data: dict[str, Any] | None = None
    code: str | None = None
    detail: str = ""
    part: int = Field(0, ge=0)
    parts: int = Field(1, ge=1)

    def answer(self, model: type[AnswerT]) -> AnswerT | None:
        """The body as `model`, or `SchemaError` when the retainer answered in another shape."""
        return _answer(self.kind, self.data, model)


class KvRequest(_Request):
    """A replicated key-value request (API.md `/v1/kv`, `/admin/kv`) for whichever replicator
    consumes its partition of `relay.replication` (partition = the key's shard mod partitions):
    that replicator coordinates it (quorum writes and reads over HTTP to the key's replicas) and
    answers with a `KvReply`. The namespace's token travels only as its SHA-256."""

    kind: Literal["kv_request"] = "kv_request"
    v: Literal[1] = 1
    op: Literal[
        "put",
        "get",
        "delete",
        "members",
        "list_members",
        "field_put",
        "field_get",
        "field_delete",
        "list_fields",
        "ns_put",
        "view",
        "view_change",
        "forget",
    ]
    """`view` and `view_change` (admin): the replicators' membership and a change of it
    (`sites`), for `/ds/storages/kv`; `forget` (admin): stop waiting for a dead replicator
    site (`sites`, one) and drop it from the view, for `PUT /ds/sites/{site}/forget`."""
    ns: str
    key: str = ""
    field: str = ""
    value: str | None = None
    """b64u (put, field_put)."""
    ttl_s: int | None = Field(None, ge=1, le=2**32 - 1)
    add: tuple[str, ...] = ()
    """b64u members (members)."""
    remove: tuple[str, ...] = ()
    cursor: str | None = None
    limit: int = Field(100, ge=1, le=1000)
    r: int | None = Field(None, ge=1)
    w: int | None = Field(None, ge=1)
    token_sha256: str = ""
    """SHA-256 (hex) of the bearer token the client presented."""
    admin: bool = False
    """Set by the ingress once the admin token was checked (ns_put)."""
    n: int | None = Field(None, ge=1)
    gc_grace_s: int | None = Field(None, ge=0)
    sites: tuple[str, ...] = ()
    """The replicator sites a membership change is to end with (view_change), or the one to
    forget (forget)."""


class KvAnswer(_Answer):
    """The body of a coordinating replicator's answer (`KvReply.answer`), in the order and
    shape `/v1/kv` and `/admin/kv` answer with it."""


class KvVersion(KvAnswer):
    # `put`, `delete`, `members`, `field_put`, `field_delete`: the write's version.
    version: str


class KvRegister(KvAnswer):
    # `get`, `field_get`: a value (b64u), its version and when it expires (ms, or None).
    value: str
    version: str
    expires_at: int | None


class KvMembers(KvAnswer):
    # `list_members`: a page of b64u members, and the cursor of the next (None: the last).
    members: list[str]
    cursor: str | None


class KvField(_Answer):
    field: str
    value: str
    """b64u."""
    version: str


class KvFields(KvAnswer):
    # `list_fields`: a page of fields, and the cursor of the next (None: the last).
    fields: list[KvField]
    cursor: str | None


class KvNamespace(KvAnswer):
    # `ns_put`: the namespace's new token (shown once) and its quorum settings.
    token: str
    n: int
    r: int
    w: int
    gc_grace_s: int


class KvView(_Answer):
    # The replicators' sites as of one view version (`relay_kv.membership.View`).
    version: StrictInt
    sites: list[str]


class KvViewChange(_Answer):
    # A change of view under way (`relay_kv.membership.Change`).
    old: KvView
    new: KvView
    step: Literal["pulling", "reading_new"] = "pulling"


class KvMembership(KvAnswer):
    # `view`: one replicator's membership state, with who is down and the largest N.
    site: str
    established: bool
    view: KvView
    sites: dict[str, str]
    """Site id → URL."""
    change: KvViewChange | None
    participants: list[str]
    reports: dict[str, int]
    """Site id → `relay_kv.membership.Report`."""
    down: list[str]
    max_n: int
    forgotten: list[str] = []
    """Sites the admin declared dead: no change waits for them."""


class KvViewChanging(KvAnswer):
    # `view_change` (202): the version of the view the change under way ends with (or, for a
    # change to the view as it is, that view's).
    version: StrictInt


class KvReply(_Record):
    """The coordinating replicator's answer to a `KvRequest`: its body is the `_Answer` model
    of the operation asked (`KvVersion`, `KvRegister`, `KvMembers`, `KvFields`,
    `KvNamespace`, `KvMembership`, `KvViewChanging`), read with `answer`."""

    kind: Literal["kv_reply"] = "kv_reply"
    v: Literal[1] = 1
    id: str
    origin: str
    instance: str
    status: int
    data: dict[str, Any] | None = None
    code: str | None = None
    detail: str = ""

    def answer(self, model: type[AnswerT]) -> AnswerT | None:
        """The body as `model`, or `SchemaError` when the replicator answered in another
        shape."""
        return _answer(self.kind, self.data, model)


class Epoch(_Record):
    """The first record of `relay.epoch`: a broker log's identity (see `relay_bus.bus`)."""

    kind: Literal["epoch"] = "epoch"
    v: Literal[1] = 1
    epoch: str
    created_by: str


Record = (
    Ping
    | AdminRequest
    | AdminReply
    | Annotated[QueueCommand, Field(discriminator="op")]
    | QueueReply
    | QueueResync
    | QueueEvent
    | Deliver
    | Epoch
    | DsRequest
    | DsReply
    | Publication
    | RetainedRequest
    | TopicSubscription
    | Fanout
    | KvRequest
    | KvReply
)
"""Every record kind; `Reply` the ones an ingress instance waits for."""
Reply = Ping | AdminReply | QueueReply | DsReply | KvReply
_ADAPTER: TypeAdapter[Record] = TypeAdapter(Annotated[Record, Field(discriminator="kind")])
_KNOWN_VERSIONS: dict[str, frozenset[int]] = {
    "ping": frozenset({1}),
    "admin": frozenset({1}),
    "admin_reply": frozenset({1}),
    "queue_cmd": frozenset({1, 2}),
    "queue_reply": frozenset({1}),
    "queue_resync": frozenset({1}),
    "queue_event": frozenset({1}),
    "deliver": frozenset({1}),
    "epoch": frozenset({1}),
    "ds_request": frozenset({1}),
    "ds_reply": frozenset({1}),
    "publication": frozenset({1}),
    "retained_request": frozenset({1}),
    "topic_sub": frozenset({1}),
    "fanout": frozenset({1}),
    "kv_request": frozenset({1}),
    "kv_reply": frozenset({1}),
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
    "admin": frozenset({topics.QUEUE_COMMANDS, topics.PUBLICATIONS}),
    "admin_reply": frozenset({topics.INGRESS_INBOX}),
    "queue_cmd": frozenset({topics.QUEUE_COMMANDS}),
    "queue_reply": frozenset({topics.INGRESS_INBOX}),
    "queue_resync": frozenset({topics.QUEUE_COMMANDS}),
    "queue_event": frozenset({topics.QUEUE_EVENTS}),
    "deliver": frozenset({topics.INGRESS_INBOX}),
    "epoch": frozenset({topics.EPOCH}),
    "ds_request": frozenset({topics.PUBLICATIONS}),
    "ds_reply": frozenset({topics.INGRESS_INBOX}),
    "publication": frozenset({topics.PUBLICATIONS}),
    "retained_request": frozenset({topics.PUBLICATIONS}),
    "topic_sub": frozenset({topics.PUBLICATIONS}),
    "fanout": frozenset({topics.INGRESS_INBOX}),
    "kv_request": frozenset({topics.REPLICATION}),
    "kv_reply": frozenset({topics.INGRESS_INBOX}),
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
        if header.kind == "queue_cmd" and header.v == 1:
            return QueueCommandV1.model_validate_json(data).upgrade()
        return _ADAPTER.validate_json(data)
    except ValidationError as error:
        raise SchemaError(
            f"invalid {header.kind!r} v{header.v}: {error.errors()[0]['msg']}"
        ) from None


def check_topic(record: Record, topic: str) -> None:
    if topic not in ALLOWED_TOPICS[record.kind]:
        raise ValueError(f"a {record.kind!r} record may not be sent to {topic}")
