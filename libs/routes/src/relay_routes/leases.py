"""The ingress inbox-slot leases the ingress instances share through Redis.

Key layout: `relay:ingress:inbox:<slot>`: a `redis-py` lock whose token is the instance that
holds the slot of `relay.ingress.inbox`, with the lease as its expiry.

Invariant: at most one instance holds a slot at a time (the lock is taken with SET NX), and a
lease that is not renewed expires by itself, so a dead instance's slot is free again after
`lease_s` without anyone's help.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.lock import Lock


def inbox_key(slot: int) -> str:
    return f"relay:ingress:inbox:{slot}"


def inbox_lease(redis: Redis, slot: int, lease_s: float) -> Lock:
    """The lock for inbox slot `slot` (not taken yet: `acquire(token=instance)` takes it)."""
    return redis.lock(inbox_key(slot), timeout=lease_s, blocking=False)
