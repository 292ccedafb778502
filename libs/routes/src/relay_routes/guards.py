"""The replay guard the ingress instances share through Redis (rate limits: `limits`).

Key layout: `relay:sig:<sha256 of the signature, 32 hex>`: a signed WebSocket command's
signature, seen once within the replay window (set NX with the window as expiry).

Invariant: one round trip per check, and every key expires by itself: losing Redis loses at most
one window's guard, never a message.
"""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis


async def first_use(redis: Redis, signature: bytes, window_s: int) -> bool:
    """True the first time `signature` is seen within `window_s` seconds (replay guard)."""
    digest = hashlib.sha256(signature).hexdigest()[:32]
    return bool(await redis.set(f"relay:sig:{digest}", 1, nx=True, ex=window_s))
