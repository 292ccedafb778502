"""Which WebSocket connection subscribes to which topic filter, by inbox slot, in Redis.

Key layout: set `relay:topicsubs:<inbox slot>`, members `<connection id>:<filter>` (connection
ids never contain `:`; filters may). Delivery reads every slot's set when it takes a partition
of `relay.publications` over; ingresses add and remove their connections' filters, and drop
their slot's set when they take the slot (whatever an earlier holder left is stale).

Invariants:
- an ingress writes a subscription here before it sends its `topic_sub` records, and removes
  it before it sends the removal, so a delivery instance that reads here after noting the
  partition's end offset, and then reads the partition from that offset on, misses no change;
- everything here is rebuildable: after Redis loses it, every ingress writes its live
  subscriptions again (`register_all`).
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis


def key(slot: int) -> str:
    return f"relay:topicsubs:{slot}"


def member(conn: str, topic_filter: str) -> str:
    return f"{conn}:{topic_filter}"


class TopicSubscriptions:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def add(self, slot: int, conn: str, topic_filter: str) -> None:
        await self.redis.sadd(key(slot), member(conn, topic_filter))

    async def remove(self, slot: int, conn: str, topic_filter: str) -> None:
        await self.redis.srem(key(slot), member(conn, topic_filter))

    async def drop_slot(self, slot: int) -> None:
        await self.redis.delete(key(slot))

    async def register_all(self, slot: int, entries: Iterable[tuple[str, str]]) -> None:
        """Write (conn, filter) entries of `slot` again, in one round trip."""
        members = [member(conn, topic_filter) for conn, topic_filter in entries]
        if members:
            await self.redis.sadd(key(slot), *members)

    async def every(self, slots: int) -> list[tuple[int, str, str]]:
        """(slot, conn, filter) of every subscription in slots 0..slots-1."""
        found: list[tuple[int, str, str]] = []
        for slot in range(slots):
            async for raw in self.redis.sscan_iter(key(slot), count=1000):
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                conn, _, topic_filter = text.partition(":")
                found.append((slot, conn, topic_filter))
        return found
