"""The admin ping's hop: stamp the ping with this service and pass it to the next topic.

Invariant: a ping past its deadline is dropped, not forwarded: its origin has already answered
the caller, and replaying old pings after a restart must not flood the chain.
"""

from __future__ import annotations

import structlog

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Handler, Received

log = structlog.get_logger(__name__)

ROUTE: tuple[str, ...] = (
    topics.QUEUE_COMMANDS,  # ingress -> queue-writer
    topics.QUEUE_EVENTS,  # queue-writer -> delivery
    topics.PUBLICATIONS,  # delivery -> retainer
    topics.REPLICATION,  # retainer -> replicator
    topics.INGRESS_INBOX,  # replicator -> the ingress instance that asked
)


def forwarder(bus: Bus, service: str, instance: str, next_topic: str) -> Handler:
    """A handler that forwards pings to `next_topic`; other records are not for it."""

    async def handle(received: Received) -> None:
        ping = received.record
        if not isinstance(ping, schemas.Ping):
            return
        now = schemas.now_ms_()
        if ping.expired(now):
            log.debug("ping_expired", id=ping.id)
            return
        hopped = ping.with_hop(service, instance, now)
        if next_topic == topics.INGRESS_INBOX:
            await bus.send(next_topic, hopped, partition=ping.reply_slot)
        else:
            await bus.send(next_topic, hopped, key=received.key)

    return handle
