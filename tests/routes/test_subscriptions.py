"""The queue subscription registry against a real Redis-compatible server (issue 18): an entry
names the subscriber the queue-writer accepted last (by SUB order, whatever order the ingresses
write in) and the one it replaced; removal takes only the caller's own entry; entries written
before orders existed still read."""

from __future__ import annotations

from relay_routes import client
from relay_routes.subscriptions import Entry, Subscriptions, key

P, Q = 3, "queue-a"


async def test_entries_follow_sub_order_and_keep_the_one_replaced(redis_url: str) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    try:
        assert await registry.claim(P, Q, 1, "a", 100)
        assert await registry.of_partition(P) == {Q: Entry(1, "a", 100, None)}
        assert await registry.claim(P, Q, 2, "b", 200)
        assert await registry.of_partition(P) == {Q: Entry(2, "b", 200, (1, "a"))}
        # A SUB older than the one recorded (its ingress wrote late): taken over already.
        assert not await registry.claim(P, Q, 3, "c", 150)
        assert await registry.of_partition(P) == {Q: Entry(2, "b", 200, (1, "a"))}
        # The same connection again keeps whom it replaced.
        assert await registry.claim(P, Q, 2, "b", 300)
        assert await registry.of_partition(P) == {Q: Entry(2, "b", 300, (1, "a"))}
        await registry.remove(P, Q, 1, "a")  # not its entry (only named as previous)
        assert await registry.of_partition(P) == {Q: Entry(2, "b", 300, (1, "a"))}
        await registry.remove(P, Q, 2, "b")
        assert await registry.of_partition(P) == {}
    finally:
        await redis.aclose()


async def test_entries_written_before_orders_read_and_are_replaced(redis_url: str) -> None:
    redis = client.connect(redis_url)
    registry = Subscriptions(redis)
    try:
        await redis.hset(key(P), Q, "4:old")  # the format before issue 18
        assert await registry.of_partition(P) == {Q: Entry(4, "old", 0, None)}
        assert await registry.claim(P, Q, 5, "new", 1)
        assert await registry.of_partition(P) == {Q: Entry(5, "new", 1, (4, "old"))}
        await redis.hset(key(P), "other", "4:old")
        await registry.remove(P, "other", 4, "old")
        assert "other" not in await registry.of_partition(P)
        await registry.register_all([(P, "again", 6, "c", 7)])  # after Redis lost them
        assert (await registry.of_partition(P))["again"] == Entry(6, "c", 7, None)
    finally:
        await redis.aclose()
