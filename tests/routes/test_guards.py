"""The ingress's shared guards against a real Redis-compatible server: the replay guard lets a
signature through once per window, the publish counter counts per address and second."""

from __future__ import annotations

from relay_routes import client, guards


async def test_a_signature_is_fresh_once_within_its_window(redis_url: str) -> None:
    redis = client.connect(redis_url)
    try:
        assert await guards.first_use(redis, b"sig-1", 60)
        assert not await guards.first_use(redis, b"sig-1", 60)
        assert await guards.first_use(redis, b"sig-2", 60)
        keys = await redis.keys("relay:sig:*")
        assert len(keys) == 2
        ttls = [await redis.ttl(key) for key in keys]
        assert all(0 < ttl <= 60 for ttl in ttls)
    finally:
        await redis.aclose()


async def test_publishes_are_counted_per_address_and_second(redis_url: str) -> None:
    redis = client.connect(redis_url)
    try:
        counts = [await guards.count_publish(redis, "10.0.0.1", 1000) for _ in range(3)]
        assert counts == [1, 2, 3]
        assert await guards.count_publish(redis, "10.0.0.2", 1000) == 1
        assert await guards.count_publish(redis, "10.0.0.1", 1001) == 1
        assert 0 < await redis.ttl("relay:rate:publish:10.0.0.1:1000") <= 2
    finally:
        await redis.aclose()
