"""The one way Relay's services connect to Redis.

Invariant: every client has bounded socket and connect timeouts, so a Redis that stops answering
turns into a `RedisError` (a 503, a readiness check going false), never a request that hangs.
"""

from __future__ import annotations

from redis.asyncio import Redis

SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0


def connect(url: str) -> Redis:
    """A client for `url` (`redis://` or `rediss://`); connections open on first use."""
    return Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=CONNECT_TIMEOUT_S
    )
