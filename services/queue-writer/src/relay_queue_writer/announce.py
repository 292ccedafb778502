"""Telling delivery that this queue-writer starts reading its partitions.

Invariant: whenever this writer starts reading a partition of `relay.queue.commands` (at
start, and again when the broker lost its log), it first sends one `writer_started` event to
that partition of `relay.queue.events`, before it applies any command there, so before any
event of its own. The events a predecessor made durable but never sent (a kill between the
fsync and the post: the SEND's asker got 503, yet the message is stored, decision 0005's
caveat) died with it; delivery answers the notice by resyncing every subscription the registry
lists for the partition (`relay_delivery.pushes`), and each subscribed queue's current head
reaches its subscriber without any client action (issue 18).

Rejected: re-announcing, at start, the heads of queues changed past the last announced
position. Knowing that position needs a durable record of what the outbox sent, written after
every post (a second log on the hot path, or marks that lag); and without it every stored
queue's head would be re-read at start, which grows with the stored queues (a million) where
the resync grows with the live subscribers only, and reuses the path delivery already takes
after its own restart.
"""

from __future__ import annotations

import asyncio

import structlog

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import StartOffsets

log = structlog.get_logger(__name__)


def announcing(bus: Bus, start_offsets: StartOffsets) -> StartOffsets:
    """`start_offsets` that first tells delivery this writer starts on the partitions."""

    async def start(partitions: list[int]) -> dict[int, int]:
        offsets = await start_offsets(partitions)
        notice = schemas.QueueEvent(event="writer_started", queue="")
        sent = await asyncio.gather(
            *(bus.send(topics.QUEUE_EVENTS, notice, partition=p) for p in partitions),
            return_exceptions=True,
        )
        failed = [p for p, s in zip(partitions, sent, strict=True) if isinstance(s, BaseException)]
        if failed:
            # Not fatal: the events lost before this start stay unsent until the next SUB or
            # delivery takeover, as before this notice existed.
            log.warning("writer_started_not_sent", partitions=failed)
        log.info("writer_started_announced", partitions=[p for p in partitions if p not in failed])
        return offsets

    return start
