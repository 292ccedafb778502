"""The Queues endpoints of API.md: validate, authenticate, hand each request to the queue-writer
that owns the queue (`relay_ingress.asking.command`) and answer with what it says.

Invariants:
- nothing reaches Kafka before the request is well-formed: ids, base64, sizes, ttl and, for
  recipient commands, the timestamp window and the signature's shape; the signed text is built
  here from the request as received (`relay_queues.auth.rest_text`);
- a recipient command with a wrong signature or for an unknown queue gets the same AUTH answer
  (the queue-writer verifies against the stored key);
- SEND answers 201 only after the queue-writer has made the message durable; a malformed
  `Idempotency-Key` (`relay_queues.idempotency`) is refused before anything reaches Kafka, and
  a SEND that gets no answer says it may have been stored (a retry with the same key is safe).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from pydantic import Field

from relay_bus import schemas
from relay_ingress import asking
from relay_ingress.checks import B64U_PATTERN, JSON_INTEGER, BoundedJsonRoute, StrictBody
from relay_ingress.context import Context
from relay_ingress.deps import Ctx
from relay_ingress.errors import ApiError, documented
from relay_queues import auth, idempotency, ids

router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/v1",
    tags=["queues"],
    responses=documented(400, 401, 403, 404, 413, 429, 503),
)

ID_PATTERN = r"^[A-Za-z0-9_-]{32}$"
IdPath = Annotated[str, Path(pattern=ID_PATTERN)]
MAX_TTL_S = 10 * 365 * 24 * 3600


class NewQueue(StrictBody):
    recipient_key: str = Field(
        pattern=r"^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$",
        description="b64u 32-byte Ed25519 public key (43 characters)",
    )


class NewMessage(StrictBody):
    body: str = Field(pattern=B64U_PATTERN, description="b64u message body")
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S), JSON_INTEGER] | None = None


class Ack(StrictBody):
    msg_id: str = Field(pattern=ID_PATTERN)


def _b64u(value: str, field: str) -> bytes:
    try:
        return ids.unb64u(value)
    except ValueError:
        raise ApiError(400, "BAD_REQUEST", f"{field}: not base64url") from None


async def _signed(
    request: Request,
    timestamp: Annotated[str | None, Header(alias="X-Relay-Timestamp")] = None,
    signature: Annotated[str | None, Header(alias="X-Relay-Signature")] = None,
) -> tuple[str, str]:
    """The text the client had to sign for this request and its b64u signature, once the
    timestamp and the signature's shape pass; AUTH otherwise."""
    try:
        ts = auth.parse_timestamp(timestamp, time.time())
        auth.parse_signature(signature)
    except auth.AuthError as error:
        raise ApiError(401, "AUTH", str(error)) from None
    assert signature is not None
    body = await request.body()
    return auth.rest_text(request.method, request.url.path, ts, body), signature


Signed = Annotated[tuple[str, str], Depends(_signed)]


async def _recipient(
    ctx: Context,
    record: type[schemas.RecipientCommand],
    queue: str,
    signed: tuple[str, str],
    **fields: Any,
) -> schemas.QueueReply:
    text, signature = signed
    return await asking.command(
        ctx,
        ids.partition_of(queue, ctx.config.kafka.partitions),
        ctx.config.request_timeout_s,
        record,
        queue=queue,
        signed=text,
        sig=signature,
        **fields,
    )


def _message(reply: schemas.QueueReply) -> schemas.QueueMessage | Response:
    """200 with the message, or 204 when the queue is empty."""
    message = asking.answer(reply, schemas.QueueMessage)
    return Response(status_code=204) if message is None else message


@router.post("/queues", status_code=201, response_model=schemas.QueueCreated)
async def create_queue(ctx: Ctx, new: NewQueue) -> schemas.QueueCreated:
    try:
        auth.parse_public_key(new.recipient_key)
    except ValueError as error:
        raise ApiError(400, "BAD_REQUEST", f"recipient_key: {error}") from None
    recipient, sender = ids.new_queue_ids(ctx.config.kafka.partitions)
    reply = await asking.command(
        ctx,
        ids.partition_of(recipient, ctx.config.kafka.partitions),
        ctx.config.request_timeout_s,
        schemas.CreateQueue,
        queue=recipient,
        sender=sender,
        recipient_key=new.recipient_key,
    )
    return asking.required(reply, schemas.QueueCreated)


SEND_UNKNOWN = (
    "the message may have been stored; a retry with the same Idempotency-Key is safe "
    "(it answers the first send's msg_id and stores nothing new)"
)


def _idempotency_key(request: Request) -> str | None:
    """The request's `Idempotency-Key`, checked (BAD_REQUEST if malformed or repeated)."""
    values = request.headers.getlist("idempotency-key")
    if not values:
        return None
    if len(values) > 1:
        raise ApiError(400, "BAD_REQUEST", "Idempotency-Key: given more than once")
    try:
        return idempotency.check_key(values[0])
    except ValueError as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None


@router.post("/send/{sender_id}", status_code=201, response_model=schemas.Sent)
async def send(
    ctx: Ctx,
    request: Request,
    sender_id: IdPath,
    message: NewMessage,
    _key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            pattern=f"^{idempotency.KEY_PATTERN.pattern}$",
            description="1-64 chars of [A-Za-z0-9_-]: a retry with the same key within the "
            "window answers the first send's msg_id and ts and stores nothing new",
        ),
    ] = None,
) -> schemas.Sent:
    """201 only once the message is durable; QUOTA when full (the first refusal also queues one
    quota marker for the recipient)."""
    key = _idempotency_key(request)
    body = _b64u(message.body, "body")
    if len(body) > ctx.config.max_body_bytes:
        raise ApiError(413, "TOO_LARGE", f"body over {ctx.config.max_body_bytes} bytes")
    reply = await asking.command(
        ctx,
        ids.partition_of(sender_id, ctx.config.kafka.partitions),
        ctx.config.request_timeout_s,
        schemas.SendMessage,
        sender=sender_id,
        unknown=SEND_UNKNOWN,
        msg_id=ids.new_id(),
        body=message.body,
        ttl_s=message.ttl_s,
        key=key,
    )
    return asking.required(reply, schemas.Sent)


@router.get("/queues/{recipient_id}", response_model=schemas.QueueInfo)
async def queue_info(ctx: Ctx, recipient_id: IdPath, signed: Signed) -> schemas.QueueInfo:
    reply = await _recipient(ctx, schemas.ReadInfo, recipient_id, signed)
    return asking.required(reply, schemas.QueueInfo)


@router.get(
    "/queues/{recipient_id}/head",
    response_model=schemas.QueueMessage,
    response_model_exclude_none=True,
    responses={204: {"description": "the queue is empty"}},
)
async def head(ctx: Ctx, recipient_id: IdPath, signed: Signed) -> schemas.QueueMessage | Response:
    """The head message; it stays in flight (not pushed to a subscriber) until ACK."""
    return _message(await _recipient(ctx, schemas.ReadHead, recipient_id, signed))


@router.post(
    "/queues/{recipient_id}/ack",
    response_model=schemas.QueueMessage,
    response_model_exclude_none=True,
    responses={204: {"description": "the queue is empty"}},
)
async def ack(
    ctx: Ctx, recipient_id: IdPath, body: Ack, signed: Signed
) -> schemas.QueueMessage | Response:
    """Acknowledge the head; answers the next message. NO_MSG if msg_id is not the head."""
    return _message(
        await _recipient(ctx, schemas.AckMessage, recipient_id, signed, msg_id=body.msg_id)
    )


@router.post("/queues/{recipient_id}/suspend")
async def suspend(ctx: Ctx, recipient_id: IdPath, signed: Signed) -> dict[str, Any]:
    await _recipient(ctx, schemas.SuspendQueue, recipient_id, signed)
    return {}


@router.delete("/queues/{recipient_id}", status_code=204)
async def delete(ctx: Ctx, recipient_id: IdPath, signed: Signed) -> Response:
    await _recipient(ctx, schemas.DeleteQueue, recipient_id, signed)
    return Response(status_code=204)
