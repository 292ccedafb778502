"""Rate limits of the ingress, in one place: a connection's frame rate (a token bucket in the
connection's memory) and a client address's publish rate (a counter per address and second in
Redis, shared by every ingress instance: `relay:rate:publish:<address>:<unix second>`).

Invariant: a limit only ever refuses (the caller answers RATE_LIMITED); it never delays or
drops anything itself, and every Redis key it writes expires by itself within 2 s.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis


class Bucket:
    """Token bucket: `rate` tokens per second, at most `burst` saved up."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        """Take one token if there is one; False when over the rate."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


async def count_publish(redis: Redis, address: str, second: int) -> int:
    """Count one publish of `address` in unix second `second`; the count so far, this included."""
    key = f"relay:rate:publish:{address}:{second}"
    async with redis.pipeline(transaction=False) as pipe:
        pipe.incr(key)
        pipe.expire(key, 2)
        count, _ = await pipe.execute()
    return int(count)
