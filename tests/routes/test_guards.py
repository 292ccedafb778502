"""The replay guard against a real Redis-compatible server: a signature passes once per window."""

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
