"""Which ingress connection subscribes to each queue, by partition, in Redis.

Key layout: hash `relay:subs:<partition>`, field = queue (recipient id), value =
`<inbox slot>:<connection id>`. Delivery reads a partition's hash when it takes the partition
over, and resyncs every subscription in it from the queue-writer.

Invariants:
- an ingress writes a subscription before it sends the SUB command, so a delivery instance that
  starts reading after that command's event has been written finds it here;
- removal takes only the caller's own entry (compare and delete in one script): a newer
  subscriber's entry is never removed by an older connection closing;
- everything here is rebuildable: after Redis loses it, every ingress writes its live
  subscriptions again (`register_all`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from relay_runtime import exits

_REMOVE_MINE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


def key(partition: int) -> str:
    return f"relay:subs:{partition}"


def value(slot: int, conn: str) -> str:
    return f"{slot}:{conn}"


def parse(raw: str) -> tuple[int, str]:
    slot, _, conn = raw.partition(":")
    return int(slot), conn


class Subscriptions:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._remove = redis.register_script(_REMOVE_MINE)

    async def add(self, partition: int, queue: str, slot: int, conn: str) -> None:
        await self.redis.hset(key(partition), queue, value(slot, conn))

    async def remove(self, partition: int, queue: str, slot: int, conn: str) -> None:
        await self._remove(keys=[key(partition)], args=[queue, value(slot, conn)])

    async def register_all(self, entries: Iterable[tuple[int, str, int, str]]) -> None:
        """(partition, queue, slot, conn) for each live subscription, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for partition, queue, slot, conn in entries:
            pipe.hset(key(partition), queue, value(slot, conn))
        await pipe.execute()

    async def of_partition(self, partition: int) -> dict[str, tuple[int, str]]:
        raw: dict[Any, Any] = await self.redis.hgetall(key(partition))
        return {
            (q.decode() if isinstance(q, bytes) else q): parse(
                v.decode() if isinstance(v, bytes) else v
            )
            for q, v in raw.items()
        }


async def wait_for_redis(redis: Redis, url: str, timeout_s: float) -> None:
    """Return once Redis answers; `StartupError` (exit 69) if it does not within the budget."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await redis.ping()
            return
        except (RedisError, OSError) as error:
            if time.monotonic() + 0.5 >= deadline:
                raise exits.StartupError(
                    f"cannot reach Redis at {url}: {error}", exits.EXIT_UNAVAILABLE
                ) from None
        await asyncio.sleep(0.5)
