"""Which ingress connection subscribes to each queue, by partition, in Redis.

Key layout: hash `relay:subs:<partition>`, field = queue (recipient id), value =
`<slot>:<conn>|<since>|<previous slot>:<previous conn>`: the connection holding the queue (its
ingress inbox slot and connection id), the queue-writer's order of its SUB (`since`, see
`relay_queues.writer.QueueRules.subscribe`), and the connection it took the queue over from
(empty when none). Values written before `since` existed (`<slot>:<conn>`) read as since 0
with no previous. Delivery reads a partition's hash when it takes the partition over: it
resyncs each current subscriber and sends END to each previous one.

Invariants:
- an entry is written only for a SUB the queue-writer has accepted (its signature verified):
  a refused SUB, whoever sends it, changes nothing here (issue 18: a bad SUB used to overwrite
  the owner's entry, and after a delivery restart the owner got no MSG);
- an entry is replaced only by a SUB with a later (or equal) `since`, so the entry names the
  subscriber the queue-writer accepted last whatever order the ingresses write in, and the one
  it replaced is kept as `previous` (so END reaches it after a delivery restart);
- removal takes only the caller's own entry (compare and delete in one script): a newer
  subscriber's entry is never removed by an older connection closing;
- everything here is rebuildable: after Redis loses it, every ingress writes its live
  subscriptions again (`register_all`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from relay_runtime import exits

# KEYS[1] the partition's hash; ARGV: queue, "<slot>:<conn>", since. Returns 1 if the caller's
# entry is current afterwards, 0 if a later SUB is recorded (the caller was taken over).
_CLAIM = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
local previous = ''
if value then
  local who, since, before = string.match(value, '^([^|]*)|?([^|]*)|?(.*)$')
  if (tonumber(since) or 0) > tonumber(ARGV[3]) then
    return 0
  end
  if who == ARGV[2] then previous = before else previous = who end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. '|' .. ARGV[3] .. '|' .. previous)
return 1
"""

_REMOVE_MINE = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value and string.match(value, '^[^|]*') == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


@dataclass(frozen=True)
class Entry:
    """One queue's registry entry."""

    slot: int
    conn: str
    since: int = 0
    """The queue-writer's order of the SUB (0: written before orders were recorded)."""
    previous: tuple[int, str] | None = None
    """(slot, conn) of the subscriber this one took the queue over from."""


def key(partition: int) -> str:
    return f"relay:subs:{partition}"


def value(slot: int, conn: str) -> str:
    return f"{slot}:{conn}"


def _who(raw: str) -> tuple[int, str]:
    slot, _, conn = raw.partition(":")
    return int(slot), conn


def parse(raw: str) -> Entry:
    who, _, rest = raw.partition("|")
    since, _, previous = rest.partition("|")
    slot, conn = _who(who)
    return Entry(slot, conn, int(since or 0), _who(previous) if previous else None)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class Subscriptions:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._remove = redis.register_script(_REMOVE_MINE)

    async def claim(self, partition: int, queue: str, slot: int, conn: str, since: int) -> bool:
        """Record an accepted SUB; False when a later accepted SUB is recorded already."""
        done = await self._claim(keys=[key(partition)], args=[queue, value(slot, conn), since])
        return bool(done)

    async def remove(self, partition: int, queue: str, slot: int, conn: str) -> None:
        await self._remove(keys=[key(partition)], args=[queue, value(slot, conn)])

    async def register_all(self, entries: Iterable[tuple[int, str, int, str, int]]) -> None:
        """(partition, queue, slot, conn, since) for each live subscription, in one round trip
        (after Redis lost them: there is nothing to compare with)."""
        pipe = self.redis.pipeline(transaction=False)
        for partition, queue, slot, conn, since in entries:
            pipe.hset(key(partition), queue, f"{value(slot, conn)}|{since}|")
        await pipe.execute()

    async def of_queue(self, partition: int, queue: str) -> Entry | None:
        raw = await self.redis.hget(key(partition), queue)
        return None if raw is None else parse(_text(raw))

    async def of_partition(self, partition: int) -> dict[str, Entry]:
        raw: dict[Any, Any] = await self.redis.hgetall(key(partition))
        return {_text(q): parse(_text(v)) for q, v in raw.items()}


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
