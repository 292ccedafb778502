"""Requests that travel over Kafka and come back to this instance's inbox.

Invariant: a caller waits at most its budget; the request carries that deadline, so whoever
holds it after the caller gave up drops it instead of acting on it. The waiting slot is always
released, whether the answer came, the budget ran out or the caller was cancelled.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any, TypedDict

from relay_bus import schemas, topics
from relay_ingress.context import Context
from relay_ingress.errors import ApiError

REPLY_GRACE_S = 2.0


class Routing(TypedDict):
    """The fields every request carries so that its answer finds the caller (and expires)."""

    id: str
    origin: str
    reply_slot: int
    deadline_ms: float


def _routing(ctx: Context, wait_s: float) -> Routing:
    assert ctx.inbox.slot is not None
    return Routing(
        id=secrets.token_urlsafe(16),
        origin=ctx.config.instance,
        reply_slot=ctx.inbox.slot,
        deadline_ms=schemas.now_ms_() + wait_s * 1000,
    )


RetainerRequest = schemas.DsRequest | schemas.RetainedRequest | schemas.Publication


async def _one_reply(
    ctx: Context,
    request: schemas.Ping | schemas.QueueCommand | RetainerRequest | schemas.KvRequest,
    topic: str,
    *,
    wait_s: float,
    timeout_detail: str,
    key: bytes | None = None,
    partition: int | None = None,
    resend_s: float | None = None,
) -> schemas.Reply:
    """Send `request` and wait for its one reply. The wait runs a little past the request's
    deadline: whoever holds it drops it only after the deadline, and an answer made just before
    it still has to travel back. With `resend_s`, the request is sent again (the same id) each
    time that long passes without a reply, for requests whose owner runs each id once and for
    which a second run is harmless. 503 with `timeout_detail` when no answer comes."""
    replies = ctx.inbox.expect(request.id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s + REPLY_GRACE_S
    try:
        while True:
            await ctx.bus.send(topic, request, key=key, partition=partition)
            left = deadline - loop.time()
            try:
                return await asyncio.wait_for(
                    replies.get(), left if resend_s is None else min(left, resend_s)
                )
            except TimeoutError:
                if resend_s is None or loop.time() >= deadline - resend_s / 2:
                    raise
    except TimeoutError:
        raise ApiError(503, "UNAVAILABLE", timeout_detail) from None
    finally:
        ctx.inbox.forget(request.id)


def _accepted(reply: schemas.QueueReply | schemas.DsReply | schemas.KvReply) -> None:
    """Raise a reply's refusal as the API error it names."""
    if reply.code is not None:
        raise ApiError(reply.status, reply.code, reply.detail)


Answered = schemas.QueueReply | schemas.DsReply | schemas.KvReply | schemas.AdminReply
_WHO = {
    "queue_reply": "queue-writer",
    "ds_reply": "retainer",
    "kv_reply": "replicator",
    "admin_reply": "owner",
}


def answer(reply: Answered, model: type[schemas.AnswerT]) -> schemas.AnswerT | None:
    """An accepted reply's body as `model` (`relay_bus.schemas`); 503 when the service
    answered in another shape (a build mismatch during an upgrade: the client may retry)."""
    try:
        return reply.answer(model)
    except schemas.SchemaError as error:
        raise ApiError(503, "UNAVAILABLE", f"unexpected answer: {error}") from None


def required(reply: Answered, model: type[schemas.AnswerT]) -> schemas.AnswerT:
    """`answer`, for an answer that must have a body (503 without one)."""
    found = answer(reply, model)
    if found is None:
        raise ApiError(503, "UNAVAILABLE", f"the {_WHO[reply.kind]} answered without a body")
    return found


def answers(replies: list[schemas.DsReply], model: type[schemas.AnswerT]) -> list[schemas.AnswerT]:
    """The bodies of every retainer's replies that have one (`every_retainer`: a retainer's
    data travels on one of its partitions' replies only), each as `model`."""
    return [found for reply in replies if (found := answer(reply, model)) is not None]


async def ping(ctx: Context, wait_s: float) -> schemas.Ping:
    """Send a ping through every service; its reply comes back with every hop stamped."""
    request = schemas.Ping(**_routing(ctx, wait_s), started_ms=schemas.now_ms_())
    reply = await _one_reply(
        ctx,
        request,
        topics.QUEUE_COMMANDS,
        wait_s=wait_s,
        timeout_detail=f"the ping did not come back within {wait_s:g} s",
        key=secrets.token_bytes(24),
    )
    assert isinstance(reply, schemas.Ping)
    return reply


async def every_queue_writer(
    ctx: Context, make: Callable[[Routing], schemas.AdminRequest], wait_s: float
) -> list[schemas.AdminReply]:
    """Send one copy of an admin request to every command partition and wait until each has
    been answered by its owner; returns the replies in partition order."""
    return await every_owner(ctx, topics.QUEUE_COMMANDS, make, wait_s, "queue-writer", "command")


async def every_owner(
    ctx: Context,
    topic: str,
    make: Callable[[Routing], schemas.AdminRequest],
    wait_s: float,
    owner: str,
    what: str,
) -> list[schemas.AdminReply]:
    """`every_queue_writer` for the owners of any keyed topic's partitions (`owner`: who they
    are, `what`: the partitions' name, for the 503)."""
    routing = _routing(ctx, wait_s)
    request = make(routing)
    partitions = ctx.config.kafka.partitions
    replies = ctx.inbox.expect(request.id)
    answered: dict[int, schemas.AdminReply] = {}
    deadline = time.monotonic() + wait_s
    try:
        await asyncio.gather(
            *(ctx.bus.send(topic, request, partition=p) for p in range(partitions))
        )
        while len(answered) < partitions:
            reply = await asyncio.wait_for(replies.get(), max(0.0, deadline - time.monotonic()))
            if isinstance(reply, schemas.AdminReply):
                answered[reply.partition] = reply
    except TimeoutError:
        missing = sorted(set(range(partitions)) - set(answered))
        raise ApiError(
            503,
            "UNAVAILABLE",
            f"no answer within {wait_s:g} s for {what} partitions {missing} "
            f"(is every {owner} running?)",
        ) from None
    finally:
        ctx.inbox.forget(request.id)
    return [answered[p] for p in sorted(answered)]


async def command(
    ctx: Context,
    partition: int,
    wait_s: float,
    record: type[schemas.QueueCommand],
    unknown: str = "the command may have been applied",
    **fields: Any,
) -> schemas.QueueReply:
    """Send a queue command (`record`, built from `fields`) to `partition` and wait for its
    reply; the reply's refusal (if any) is raised as the API error it names. 503 when no answer
    comes within `wait_s`, with `unknown` saying what the asker may assume: a queue-writer
    that holds the command past its deadline drops it, but one killed between its fsync and
    its reply has applied it."""
    reply = await _one_reply(
        ctx,
        record(**_routing(ctx, wait_s), **fields),
        topics.QUEUE_COMMANDS,
        wait_s=wait_s,
        timeout_detail=f"no answer within {wait_s:g} s; {unknown}",
        partition=partition,
    )
    assert isinstance(reply, schemas.QueueReply)
    _accepted(reply)
    return reply


async def retainer(
    ctx: Context,
    partition: int,
    record: type[RetainerRequest] = schemas.DsRequest,
    **fields: Any,
) -> schemas.DsReply:
    """Send a request (`record`: durable streams by default) to the retainer owning
    `partition` of `relay.publications` and wait for its answer; a refusal is raised as the
    API error it names. 503 when no answer comes within the request timeout (the request
    expires unapplied at the retainer)."""
    wait_s = ctx.config.request_timeout_s
    reply = await _one_reply(
        ctx,
        record(**_routing(ctx, wait_s), **fields),
        topics.PUBLICATIONS,
        wait_s=wait_s,
        timeout_detail=f"no answer within {wait_s:g} s from the retainer of partition "
        f"{partition}; nothing was stored",
        partition=partition,
    )
    assert isinstance(reply, schemas.DsReply)
    _accepted(reply)
    return reply


async def post_publication(ctx: Context, partition: int, **fields: Any) -> None:
    """Send a publication that nobody answers (not retained): done once Kafka has it."""
    wait_s = ctx.config.request_timeout_s
    request = schemas.Publication(**_routing(ctx, wait_s), **fields)
    await ctx.bus.send(topics.PUBLICATIONS, request, partition=partition)


async def every_retainer(
    ctx: Context,
    record: type[schemas.DsRequest | schemas.RetainedRequest] = schemas.DsRequest,
    **fields: Any,
) -> list[schemas.DsReply]:
    """Send one copy of a request (`record`: durable streams by default) to every partition of
    `relay.publications` and wait until each has been answered in full (all its parts) by its
    owner; returns every reply in (partition, part) order. The first refusal (in partition
    order) is raised as the API error it names."""
    wait_s = ctx.config.request_timeout_s
    routing = _routing(ctx, wait_s)
    request = record(**routing, **fields)
    partitions = ctx.config.kafka.partitions
    replies = ctx.inbox.expect(request.id)
    got: dict[int, dict[int, schemas.DsReply]] = {}
    complete: set[int] = set()
    deadline = time.monotonic() + wait_s + REPLY_GRACE_S
    try:
        await asyncio.gather(
            *(ctx.bus.send(topics.PUBLICATIONS, request, partition=p) for p in range(partitions))
        )
        while len(complete) < partitions:
            reply = await asyncio.wait_for(replies.get(), max(0.0, deadline - time.monotonic()))
            if not isinstance(reply, schemas.DsReply):
                continue
            parts = got.setdefault(reply.partition, {})
            parts[reply.part] = reply
            if len(parts) >= reply.parts:
                complete.add(reply.partition)
    except TimeoutError:
        missing = sorted(set(range(partitions)) - complete)
        raise ApiError(
            503,
            "UNAVAILABLE",
            f"no answer within {wait_s:g} s for publication partitions {missing} "
            "(is every retainer running?)",
        ) from None
    finally:
        ctx.inbox.forget(request.id)
    ordered = [got[p][part] for p in sorted(got) for part in sorted(got[p])]
    for reply in ordered:
        _accepted(reply)
    return ordered


KV_READS = frozenset({"get", "list_members", "field_get", "list_fields", "view"})


async def replicator(ctx: Context, shard: int, **fields: Any) -> schemas.KvReply:
    """Send a key-value request to the partition of `relay.replication` of its key's shard
    (`shard mod partitions`, keyed by the shard) and wait for the coordinating replicator's
    answer; a refusal is raised as the API error it names. When no answer comes within the
    request timeout: 503 for a read, 504 INDETERMINATE for a write (it reached Kafka, so a
    replicator may have applied it; retrying it is safe). Sent again every `kv_resend_s` without
    an answer, so a coordinator killed with the request in hand delays it instead of losing it."""
    wait_s = ctx.config.request_timeout_s
    try:
        reply = await _one_reply(
            ctx,
            schemas.KvRequest(**_routing(ctx, wait_s), **fields),
            topics.REPLICATION,
            wait_s=wait_s,
            timeout_detail=f"no answer within {wait_s:g} s from the replicators",
            key=shard.to_bytes(2, "big"),
            partition=shard % ctx.config.kafka.partitions,
            resend_s=ctx.config.kv_resend_s,
        )
    except ApiError as error:
        if fields.get("op") in KV_READS:
            raise
        # The request reached Kafka: a replicator may have written it before the time ran out.
        raise ApiError(
            504,
            "INDETERMINATE",
            f"{error.detail}; the write may or may not become visible; retrying is safe",
        ) from None
    assert isinstance(reply, schemas.KvReply)
    _accepted(reply)
    return reply
