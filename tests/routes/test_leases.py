"""Inbox-slot leases against a real Redis-compatible server: one holder per slot, expiring."""

from __future__ import annotations

from relay_routes import client, leases


async def test_an_inbox_slot_is_held_by_one_instance_until_released(redis_url: str) -> None:
    redis = client.connect(redis_url)
    try:
        first = leases.inbox_lease(redis, 7, 30.0)
        assert await first.acquire(token="instance-a")
        assert not await leases.inbox_lease(redis, 7, 30.0).acquire(token="instance-b")
        assert await leases.inbox_lease(redis, 8, 30.0).acquire(token="instance-b")
        assert await redis.get(leases.inbox_key(7)) == b"instance-a"
        assert 0 < await redis.ttl("relay:ingress:inbox:7") <= 30
        await first.release()
        assert await leases.inbox_lease(redis, 7, 30.0).acquire(token="instance-b")
    finally:
        await redis.delete(leases.inbox_key(7), leases.inbox_key(8))
        await redis.aclose()
