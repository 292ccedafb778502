"""This ingress instance's inbox: a leased partition of `relay.ingress.inbox` and the requests
waiting for a reply on it.

Invariants:
- an instance reads only the inbox slot it holds a Redis lease for (`relay_routes.leases`,
  renewed every `LEASE_S / 3`), so replies reach the instance whose caller waits;
- it reads from the slot's end offset at the time it took the slot, so replies written for an
  earlier holder before then are never read; after a broker log loss, from offset 0;
- a reply for a request that is no longer waiting (timed out) is dropped; a request may get
  several replies (an admin request answered once per command partition).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from relay_bus import schemas, topics
from relay_bus.bus import Bus
from relay_bus.consumers import Received
from relay_routes import leases
from relay_runtime import exits
from relay_runtime.readiness import Readiness

log = structlog.get_logger(__name__)

LEASE_S = 15.0


class Inbox:
    def __init__(
        self,
        redis: Redis,
        bus: Bus,
        instance: str,
        slots: int,
        readiness: Readiness,
        *,
        deliver: Callable[[schemas.Deliver], Awaitable[None]],
        fanout: Callable[[schemas.Fanout], Awaitable[None]],
        retaken: Callable[[], Awaitable[None]],
    ) -> None:
        self.redis = redis
        self.bus = bus
        self.instance = instance
        self.slots = slots
        self.readiness = readiness
        self.deliver = deliver
        self.fanout = fanout
        self.retaken = retaken
        """Called when the lease was lost and taken back: Redis may have lost routing state."""
        self.slot: int | None = None
        self._lock: Lock | None = None
        self._waiting: dict[str, asyncio.Queue[schemas.Reply]] = {}
        self._renewer: asyncio.Task[None] | None = None
        readiness.register("inbox")

    async def lease(self) -> int:
        """Take the first free slot or raise `StartupError` when every slot is held."""
        for slot in range(self.slots):
            lock = leases.inbox_lease(self.redis, slot, LEASE_S)
            if await lock.acquire(token=self.instance):
                self.slot, self._lock = slot, lock
                self.readiness.set("inbox", True)
                self._renewer = asyncio.create_task(self._renew(), name="inbox-lease")
                log.info("inbox_leased", slot=slot)
                return slot
        raise exits.StartupError(
            f"all {self.slots} ingress inbox slots are held by other instances "
            "(raise RELAY_KAFKA__INBOX_PARTITIONS to run more ingress instances)",
            exits.EXIT_UNAVAILABLE,
        )

    async def _renew(self) -> None:
        assert self._lock is not None
        while True:
            await asyncio.sleep(LEASE_S / 3)
            try:
                try:
                    await self._lock.reacquire()
                except LockError:
                    # Lost (Redis restarted or the lease lapsed): take the same slot back.
                    if not await self._lock.acquire(token=self.instance):
                        raise LockError("inbox slot taken by another instance") from None
                    log.warning("inbox_released_and_retaken", slot=self.slot)
                    await self.retaken()
                self.readiness.set("inbox", True)
            except (LockError, RedisError) as error:
                log.warning("inbox_lease_lost", slot=self.slot, error=str(error))
                self.readiness.set("inbox", False)

    async def claim_offsets(self, _: list[int]) -> dict[int, int]:
        """Reading starts at the slot's end offset when it was taken."""
        assert self.slot is not None
        return await self.bus.end_offsets(topics.INGRESS_INBOX, [self.slot])

    async def handle(self, received: Received) -> None:
        reply = received.record
        if isinstance(reply, schemas.Deliver):
            await self.deliver(reply)
        elif isinstance(reply, schemas.Fanout):
            await self.fanout(reply)
        elif isinstance(reply, schemas.Reply) and reply.origin == self.instance:
            waiting = self._waiting.get(reply.id)
            if waiting is not None:
                waiting.put_nowait(reply)

    def expect(self, request_id: str) -> asyncio.Queue[schemas.Reply]:
        """Start collecting replies to `request_id`; call `forget` when done."""
        replies: asyncio.Queue[schemas.Reply] = asyncio.Queue()
        self._waiting[request_id] = replies
        return replies

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        if self._lock is not None:
            with contextlib.suppress(LockError, RedisError):
                await self._lock.release()
        self.readiness.set("inbox", False)
