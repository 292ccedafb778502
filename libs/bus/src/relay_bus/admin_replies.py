"""Answers to the admin requests every owner runs once per id (`/admin/dump`, `/admin/export`).

Invariant: one `admin_reply` per copy of the request read (one per partition), sent to the
asking ingress's inbox slot, naming the partition and the instance, its result the
operation's `schemas.AdminAnswer` model; a request past its deadline is not answered (its
asker stopped waiting).
"""

from __future__ import annotations

from relay_bus import schemas, topics
from relay_bus.bus import Bus


async def answer(
    bus: Bus,
    request: schemas.AdminRequest,
    partition: int,
    instance: str,
    result: schemas.AdminAnswer,
) -> None:
    if request.expired():
        return
    reply = schemas.AdminReply(
        id=request.id,
        origin=request.origin,
        partition=partition,
        instance=instance,
        result=result.model_dump(),
    )
    await bus.send(topics.INGRESS_INBOX, reply, partition=request.reply_slot)
