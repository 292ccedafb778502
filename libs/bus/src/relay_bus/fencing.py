"""Fenced ownership of one stateful instance: which partitions it serves, and how that changes.

The assignment in force is the newest of the data directory's `ownership.json` and the
acceptances published to `relay.ownership` (decision 0019); only instance 0 may start a pool
that has neither (generation 1, p mod n), the others wait for it. `install` takes a newer
generation (the operator's moves); an older one or a conflicting one changes nothing.

Invariants:
- the instance serves a partition only while the newest generation it accepted gives it that
  partition and no other instance's published acceptance still does
  (`relay_runtime.assignment.serving`);
- accepting a generation that removes partitions stops serving them (`stop_serving` has
  returned: no record of them is handled any more) before the new assignment is recorded,
  published or acknowledged; it is recorded on disk before it is published, and published
  before any partition it adds is served;
- a partition the instance gained while it was down (the newest generation at start comes
  from another instance's publication and gives it a partition its own record did not,
  `assignment.gained_while_down`) is not served until an install tells it (decision 0020: a
  hand-off's target restarted before its commit would otherwise serve from its prefetched
  copy);
- installs run one at a time;
- an instance publishes for another ordinal only what it accepted itself, and only for an
  ordinal that assignment gives nothing (`publish_for_lost`: a pod lost with its volume);
- what the instance accepted stays published: checked every `KEEP_INTERVAL_S` and published
  again when missing (a broker that lost its log), since the fence takes an instance with
  nothing published for one that serves nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from relay_bus import clients
from relay_bus.ownership_log import OwnershipLog
from relay_runtime import assignment, exits, ownership

log = structlog.get_logger(__name__)

WAIT_POLL_S = 0.5
KEEP_INTERVAL_S = 5.0
"""How often an instance checks that `relay.ownership` still holds its acceptance."""

Serve = Callable[[list[int]], Awaitable[None]]
"""Serve exactly these partitions from now on; returns once the dropped ones are fenced."""


class Refused(Exception):
    """An install refused; nothing changed. `code`: STALE_GENERATION or CONFLICTING_ASSIGNMENT."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class Ownership:
    def __init__(
        self,
        log_: OwnershipLog,
        data_dir: Path,
        service: str,
        ordinal: int,
        partitions: int,
        replicas: int,
        serve: Serve,
    ) -> None:
        self.log = log_
        self.data_dir = data_dir
        self.service = service
        self.ordinal = ordinal
        self.partitions = partitions
        self.replicas = replicas
        self.serve = serve
        self.accepted: assignment.Assignment | None = None
        self.serving: list[int] = []
        self.withheld: list[int] = []
        """Gained while down: owned but not served until an install (see the invariants)."""
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None

    async def start(
        self,
        timeout_s: float,
        prepare: Callable[[assignment.Assignment], Awaitable[None]] | None = None,
    ) -> None:
        """Decide what to serve at start (the bus started, the consumer on no partition),
        call `prepare` with the assignment decided, then serve."""
        try:
            await self._start(timeout_s, prepare)
        except clients.KafkaError as error:
            raise exits.StartupError(
                f"{self.log.topic} could not be read or written: {error}", exits.EXIT_UNAVAILABLE
            ) from None

    async def _start(
        self,
        timeout_s: float,
        prepare: Callable[[assignment.Assignment], Awaitable[None]] | None,
    ) -> None:
        recorded = ownership.claim_data_dir(
            self.data_dir, self.service, self.ordinal, self.partitions
        )
        await self.log.start()
        deadline = time.monotonic() + timeout_s
        while True:
            published = await self.log.read(self.partitions)
            try:
                newest = assignment.newest(recorded, *published.values())
            except assignment.InvalidAssignment as error:
                raise exits.StartupError(
                    f"{self.service} ownership: {error}; the operator must install a newer "
                    "generation",
                    exits.EXIT_CONFIG,
                ) from None
            if newest is None and self.ordinal == 0:
                newest = assignment.initial(self.partitions, self.replicas)
                log.info("ownership_bootstrapped", replicas=self.replicas)
            if newest is not None:
                break
            if time.monotonic() > deadline:
                raise exits.StartupError(
                    f"no {self.service} assignment is recorded or published yet; instance 0 "
                    "publishes the first",
                    exits.EXIT_UNAVAILABLE,
                )
            await asyncio.sleep(WAIT_POLL_S)
        self.withheld = assignment.gained_while_down(self.ordinal, recorded, newest)
        if self.withheld:
            log.warning(
                "ownership_withheld", partitions=self.withheld, generation=newest.generation
            )
        if prepare is not None:
            await prepare(newest)
        await self._accept(newest)
        self._keeper = asyncio.create_task(self.keep_published(), name="ownership-keeper")

    async def install(self, offered: assignment.Assignment) -> dict[str, Any]:
        """Accept `offered` if it is newer (or the same again: partitions whose previous owner
        has since let go are taken up); refuse an older or conflicting one."""
        assignment.validate(offered, self.partitions)
        async with self._lock:
            verdict = assignment.compare(self.accepted, offered)
            if verdict is assignment.Verdict.STALE:
                assert self.accepted is not None
                raise Refused(
                    "STALE_GENERATION",
                    f"generation {offered.generation} is older than generation "
                    f"{self.accepted.generation} in force",
                )
            if verdict is assignment.Verdict.CONFLICT:
                raise Refused(
                    "CONFLICTING_ASSIGNMENT",
                    f"generation {offered.generation} is in force with another assignment",
                )
            self.withheld = []  # told: what it owns is its to serve
            await self._accept(offered)
            return self.state()

    async def publish_for_lost(self, lost: int) -> dict[str, Any]:
        """Publish the accepted assignment as ordinal `lost`'s acceptance (its pod and volume
        are gone for good: it will never publish again), then take up what that unblocks.
        Refused (`Refused`, nothing published) for this instance's own ordinal, before any
        assignment is accepted, and while the accepted one still gives `lost` partitions
        (they would stay unserved: install a generation that moves them first). Should `lost`
        come back after all, it finds this publication newer than its own record and serves
        only what it gives it; if it was alive all along, its keeper publishes its own
        acceptance again, which blocks its partitions here again: the fence holds either way."""
        async with self._lock:
            if lost == self.ordinal:
                raise Refused("NOT_LOST", f"ordinal {lost} is this instance")
            accepted = self.accepted
            if accepted is None:
                raise Refused("NOT_READY", "no assignment accepted yet")
            if accepted.owned(lost):
                raise Refused(
                    "ORDINAL_OWNS",
                    f"generation {accepted.generation} gives ordinal {lost} partitions "
                    f"{accepted.owned(lost)}: install a generation that moves them first",
                )
            await self.log.publish(lost, accepted)
            log.warning("ownership_published_for_lost", lost=lost, generation=accepted.generation)
            await self._accept(accepted)
            return self.state()

    async def _accept(self, offered: assignment.Assignment) -> None:
        mine = set(offered.owned(self.ordinal))
        kept = [p for p in self.serving if p in mine]
        if kept != self.serving:
            await self.serve(kept)
            log.info("partitions_released", released=sorted(set(self.serving) - mine))
            self.serving = kept
        if offered != self.accepted:
            await asyncio.to_thread(
                ownership.write, self.data_dir, self.service, self.ordinal, offered
            )
        self.accepted = offered
        await self.log.publish(self.ordinal, offered)
        published = await self.log.read(self.partitions)
        serving = [
            p
            for p in assignment.serving(self.ordinal, offered, published)
            if p not in self.withheld
        ]
        if serving != self.serving:
            await self.serve(serving)
            self.serving = serving
        log.info(
            "ownership_accepted",
            generation=offered.generation,
            serving=serving,
            pending=sorted(mine - set(serving)),
        )
        if not mine:
            log.warning("owns_nothing", generation=offered.generation, ordinal=self.ordinal)

    def state(self) -> dict[str, Any]:
        accepted = self.accepted
        owned = [] if accepted is None else accepted.owned(self.ordinal)
        return {
            "service": self.service,
            "ordinal": self.ordinal,
            "assignment": None if accepted is None else accepted.to_json(),
            "generation": None if accepted is None else accepted.generation,
            "owned": owned,
            "serving": list(self.serving),
            "pending": [p for p in owned if p not in self.serving],
            "withheld": list(self.withheld),
            "owns_nothing": not owned,
        }

    async def keep_published(self, interval_s: float = KEEP_INTERVAL_S) -> None:
        """Publish the accepted assignment again whenever `relay.ownership` lacks it (a broker
        that lost its log, a compaction gone wrong): the fence counts an instance with nothing
        published as serving nothing, so an instance that serves must stay published. Runs
        until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            async with self._lock:
                if self.accepted is None:
                    continue
                try:
                    published = await self.log.read(self.partitions)
                    if published.get(self.ordinal) != self.accepted:
                        await self.log.publish(self.ordinal, self.accepted)
                        log.warning("ownership_republished", generation=self.accepted.generation)
                except clients.KafkaError as error:
                    log.warning("ownership_check_failed", error=str(error))

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
            self._keeper = None
        await self.log.close()
