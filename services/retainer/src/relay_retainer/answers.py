"""What the retainer answers: an operation's outcome, the store's errors as the API's codes, and
the `ds_reply` record that carries it to the asker's inbox slot.

Invariants: every operation ends in an `Outcome` (`relay_durable.outcome`; a store fault it did
not expect is logged and answered 503 `UNAVAILABLE`, never left unanswered); refused input is 400,
a missing database or topic 404, a full retained store 429 `QUOTA`, a write not made durable in
time 503; a reply that Kafka does not take is dropped (its asker times out with 503).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import structlog

from relay_bus import schemas, topics
from relay_bus.bus import Bus, BusUnavailableError
from relay_durable import codec
from relay_durable.outcome import Outcome
from relay_retainer.rounds import Expired
from relay_streams.errors import BadInput, Closed, NotFound, WriteFailed
from relay_streams.retained import RetainedFull
from relay_topics import rules as topic_rules

log = structlog.get_logger(__name__)


def _refused(status: int, code: str, error: BaseException) -> Outcome:
    return Outcome.refused(status, code, str(error))


async def guarded(operation: Awaitable[Outcome], what: str) -> Outcome:
    """The operation's outcome, or its error as the refusal it stands for."""
    try:
        return await operation
    except (BadInput, topic_rules.TopicError) as error:
        return _refused(400, "BAD_REQUEST", error)
    except NotFound as error:
        return _refused(404, "NOT_FOUND", error)
    except RetainedFull as error:
        return _refused(429, "QUOTA", error)
    except (Expired, WriteFailed, Closed) as error:
        return _refused(503, "UNAVAILABLE", error)
    except Exception as error:  # the store's own faults (corrupt records, ...) included
        log.exception("retainer_request_failed", what=what)
        return _refused(503, "UNAVAILABLE", error)


def payload(text: str) -> bytes:
    """A request's base64url payload (`relay_durable.codec`), or `BadInput` (400)."""
    try:
        return codec.unb64u(text)
    except ValueError:
        raise BadInput("payload is not base64url") from None


async def reply(
    bus: Bus,
    request: schemas.DsRequest | schemas.RetainedRequest | schemas.Publication,
    partition: int,
    instance: str,
    site: str,
    outcome: Outcome,
    data: dict[str, Any] | None,
    part: int = 0,
    parts: int = 1,
) -> bool:
    """Send one answer record for `partition`; False when Kafka did not take it."""
    record = schemas.DsReply(
        id=request.id,
        origin=request.origin,
        partition=partition,
        instance=instance,
        site=site,
        status=outcome.status,
        data=data,
        code=outcome.code,
        detail=outcome.detail,
        part=part,
        parts=parts,
    )
    try:
        await bus.send(topics.INGRESS_INBOX, record, partition=request.reply_slot)
    except BusUnavailableError as error:
        log.warning("retainer_reply_lost", kind=request.kind, error=str(error))
        return False
    return True
