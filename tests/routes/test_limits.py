"""The ingress's rate limits: the frame token bucket, and the publish counter against a real
Redis-compatible server (per address and second, expiring)."""

from __future__ import annotations

from relay_routes import client, limits


def test_the_bucket_allows_its_burst_then_its_rate() -> None:
    bucket = limits.Bucket(rate=50.0, burst=3)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    bucket.at -= 0.05  # as if 50 ms had passed: 2.5 tokens at 50/s
    assert [bucket.take() for _ in range(3)] == [True, True, False]


async def test_publishes_are_counted_per_address_and_second(redis_url: str) -> None:
    redis = client.connect(redis_url)
    try:
        counts = [await limits.count_publish(redis, "10.0.0.1", 1000) for _ in range(3)]
        assert counts == [1, 2, 3]
        assert await limits.count_publish(redis, "10.0.0.2", 1000) == 1
        assert await limits.count_publish(redis, "10.0.0.1", 1001) == 1
        assert 0 < await redis.ttl("relay:rate:publish:10.0.0.1:1000") <= 2
    finally:
        await redis.aclose()
