"""Hand-off of one publication partition (decision 0022): the routes of
`relay_bus.handoff_routes` over the retainer's stores, its data being the partition's retained
messages and durable-stream messages (`relay_streams.partition_state`).

- the export is the partition's whole data as one JSON unit, read while the instance keeps
  serving (prefetch: a copy of most of it) or after its pause (the final copy); a prefetch and
  a catch-up both pull the whole unit, and the install writes only what differs from what is
  held, so a catch-up over a prefetched copy writes the messages changed since;
- the pause waits, once the fence holds, for the writes of the partition's records read
  before it (the retainer answers a record once its write is durable, after its handler
  returned: `relay_retainer.rounds`), so its digest is of the final, durable state;
- the target serves the partition from its consumer group's committed offset, which the
  source's fence committed where it stopped (`relay_bus.consumers.reassign`): the data it
  imported is exactly that of the records before it.

Invariants (besides those of `relay_bus.handoff_routes`): a body that is not a partition state
of this topic (malformed, a digest not its own, another partition count, a partition other
than the path's, a topic of another partition) is 400 and changes nothing; an import answers
once what it installed is durable, and importing the same unit again gives the same state;
installs and deletes run one at a time, in a worker thread (the stores' calls hold the GIL
only per batch, so the partitions served are served meanwhile); a unit the retained store
cannot take (its `max_retained`) is 409 `RETAINED_FULL`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse

from relay_bus import routing
from relay_bus.bus import Bus
from relay_bus.fencing import Ownership
from relay_bus.handoff_routes import PartitionHandoff, Refusal, json_body
from relay_retainer.retained import RetainedHost
from relay_retainer.streams import StreamHost
from relay_streams import partition_state
from relay_streams.errors import Closed, StreamsError
from relay_streams.retained import RetainedFull, RetainedStore
from relay_streams.settings import DbSettings
from relay_streams.store import StreamStore

log = structlog.get_logger(__name__)


class RetainerHandoff(PartitionHandoff):
    def __init__(
        self,
        bus: Bus,
        streams: StreamHost,
        retained: RetainedHost,
        owner: Ownership,
        partitions: int,
        token: str | None,
    ) -> None:
        super().__init__(owner, partitions, token)
        self.bus = bus
        self.streams = streams
        self.retained = retained
        self._installing = asyncio.Lock()

    def _belongs(self, partition: int) -> Callable[[str], bool]:
        partitions = self.partitions
        return lambda topic: routing.partition_of_topic(topic, partitions) == partition

    def _stores(self) -> tuple[RetainedStore, StreamStore]:
        try:
            return self.retained.store, self.streams.store
        except Closed:
            raise Refusal(503, "UNAVAILABLE", "the stores are not open; again") from None

    async def _collect(self, partition: int) -> partition_state.PartitionState:
        return await asyncio.to_thread(
            partition_state.collect,
            *self._stores(),
            partition,
            self.partitions,
            self._belongs(partition),
            self.bus.epoch or "",
        )

    async def summary(self, partition: int) -> dict[str, Any]:
        return partition_state.summary(await self._collect(partition))

    async def paused(self, partition: int) -> None:
        await asyncio.sleep(0)  # operations of records read before the fence hand over writes
        await asyncio.gather(self.streams.settled(), self.retained.settled())

    async def export(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
        except Refusal as refusal:
            return refusal.response()
        serving = partition in self.owner.serving  # not served now: nothing changes it
        unit = partition_state.to_json(await self._collect(partition))
        return JSONResponse({**unit, "serving": serving})

    def _offered(self, partition: int, body: Any) -> partition_state.PartitionState:
        """The state `body` carries for `partition`, or `Refusal`."""
        if isinstance(body, dict) and body.get("partitions") != self.partitions:
            raise Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of {body.get('partitions')!r} partitions, this topic has "
                f"{self.partitions}",
            )
        if isinstance(body, dict) and body.get("partition") != partition:
            raise Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of partition {body.get('partition')!r}, this is {partition}",
            )
        try:
            return partition_state.from_json(body, self._belongs(partition))
        except ValueError as error:
            raise Refusal(400, "BAD_STATE", str(error)) from None

    async def _install(self, state: partition_state.PartitionState) -> dict[str, Any]:
        """Make the stores hold `state` for its partition; the summary once durable."""
        new_db = DbSettings(shards=self.streams.settings.shards)
        async with self._installing:
            self.not_served(state.partition)
            try:
                changed = await asyncio.to_thread(
                    partition_state.install,
                    *self._stores(),
                    state,
                    self._belongs(state.partition),
                    new_db,
                )
            except RetainedFull as error:
                raise Refusal(409, "RETAINED_FULL", str(error)) from None
            except StreamsError as error:
                raise Refusal(400, "BAD_STATE", str(error)) from None
        log.info("handoff_installed", partition=state.partition, changed=changed)
        return await self.described(state.partition)

    async def import_(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            self.not_served(partition)
            state = self._offered(partition, json_body(await request.body()))
            return JSONResponse(await self._install(state))
        except Refusal as refusal:
            return refusal.response()

    async def forget(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            self.not_served(partition)
            return JSONResponse(
                await self._install(partition_state.empty(partition, self.partitions))
            )
        except Refusal as refusal:
            return refusal.response()

    async def _pulled(self, request: Request, *, final: bool) -> JSONResponse:
        try:
            partition = self.checked(request)
            source = self.source(await request.body())
            self.not_served(partition)
            state = self._offered(partition, await self.pull(partition, source, final=final))
            answer = await self._install(state)
        except Refusal as refusal:
            return refusal.response()
        carried = {"retained": len(state.retained), "whole": True}
        return JSONResponse({**answer, "carried": carried})

    async def prefetch(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=False)

    async def catch_up(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=True)
