"""Short-lived counters and markers the ingress instances share through Redis.

Key layout:
- `relay:sig:<sha256 of the signature, 32 hex>`: a signed WebSocket command's signature, seen
  once within the replay window (set NX with the window as expiry);
- `relay:rate:publish:<client address>:<unix second>`: publishes of one address in one second,
  over every ingress instance (INCR, expiring after 2 s).

Invariant: each function reads and changes only its own keys, in one round trip, and every key
expires by itself: losing Redis loses at most one window's guard, never a message.
"""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis


async def first_use(redis: Redis, signature: bytes, window_s: int) -> bool:
    """True the first time `signature` is seen within `window_s` seconds (replay guard)."""
    digest = hashlib.sha256(signature).hexdigest()[:32]
    return bool(await redis.set(f"relay:sig:{digest}", 1, nx=True, ex=window_s))


async def count_publish(redis: Redis, address: str, second: int) -> int:
    """Count one publish of `address` in unix second `second`; the count so far, this included."""
    key = f"relay:rate:publish:{address}:{second}"
    async with redis.pipeline(transaction=False) as pipe:
        pipe.incr(key)
        pipe.expire(key, 2)
        count, _ = await pipe.execute()
    return int(count)
