"""Hand-off of one publication partition (decision 0022): the routes of
`relay_bus.handoff_routes` over the retainer's stores, its data being the partition's retained
messages and durable-stream messages (`relay_streams.partition_state`).

- the export is the partition's whole data as one JSON unit, named by the watch it starts
  (`since`, `relay_streams.partition_watch`): collected while the instance keeps serving
  (prefetch), then settled exact with the writers held for the time of reading again what was
  written meanwhile; with `?since=<that name>`, only the changes since (`changes: true`);
- the pause waits, once the fence holds, for the writes of the partition's records read
  before it (the retainer answers a record once its write is durable, after its handler
  returned: `relay_retainer.rounds`), so its digest is of the final, durable state; a digest
  comes from the partition's watch where there is one (its keys, not its messages);
- a catch-up over a prefetched copy asks only for the changes since it, installs them, and
  compares the digest its own watch then gives with the source's; if they differ, it pulls
  the whole partition. The answer says what was carried (`carried`);
- the target serves the partition from its consumer group's committed offset, which the
  source's fence committed where it stopped (`relay_bus.consumers.reassign`): the data it
  imported is exactly that of the records before it.

Invariants (besides those of `relay_bus.handoff_routes`): a body that is not a partition state
of this topic (malformed, a digest not its own, another partition count, a partition other
than the path's, a topic of another partition) is 400 and changes nothing; an import answers
once what it installed is durable, and importing the same unit again gives the same state;
installs and deletes run one at a time, in a worker thread (the stores' calls hold the GIL
only per batch, so the partitions served are served meanwhile); a unit the retained store
cannot take (its `max_retained`) is 409 `RETAINED_FULL`; the writers are held only while an
export rereads what was written during its collection, or while the watch of a partition
served here is read in a worker thread (the writers' hooks change it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relay_bus import routing
from relay_bus.bus import Bus
from relay_bus.fencing import Ownership
from relay_bus.handoff_routes import PartitionHandoff, Refusal, json_body, unit_response
from relay_retainer.retained import RetainedHost
from relay_retainer.streams import StreamHost
from relay_streams import partition_state as ps
from relay_streams import partition_watch as pw
from relay_streams.errors import Closed, StreamsError
from relay_streams.partition_watch import Watches
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
        self.watches = Watches(
            partitions, lambda topic: routing.partition_of_topic(topic, partitions)
        )
        streams.watches = retained.watches = self.watches
        self._installing = asyncio.Lock()

    def _belongs(self, partition: int) -> Callable[[str], bool]:
        partitions = self.partitions
        return lambda topic: routing.partition_of_topic(topic, partitions) == partition

    def _stores(self) -> tuple[RetainedStore, StreamStore]:
        try:
            return self.retained.store, self.streams.store
        except Closed:
            raise Refusal(503, "UNAVAILABLE", "the stores are not open; again") from None

    async def _collect(self, partition: int) -> ps.PartitionState:
        return await asyncio.to_thread(
            ps.collect,
            *self._stores(),
            partition,
            self.partitions,
            self._belongs(partition),
            self.bus.epoch or "",
        )

    async def _watched(self, partition: int, token: str | None = None) -> ps.PartitionState:
        """The partition's whole state, exact as it stands once returned, and a watch of it
        (named `token`, or a fresh name) that follows every write from then on."""
        watch = self.watches.start(partition, token)
        state = await self._collect(partition)
        async with self.retained.held(), self.streams.held():
            started = time.perf_counter()
            reread = await asyncio.to_thread(watch.reread, *self._stores())
            held_ms = (time.perf_counter() - started) * 1000
        exact = await asyncio.to_thread(reread.apply, state)
        watch.follow(await asyncio.to_thread(ps.Digests.of, exact))
        log.info("handoff_settled", partition=partition, held_ms=round(held_ms, 1))
        return exact

    @asynccontextmanager
    async def _still(self, partition: int) -> AsyncIterator[None]:
        """While the partition is served, hold the writers (their hooks change its watch,
        which a worker thread is about to read); else nothing writes it."""
        if partition not in self.owner.serving:
            yield
            return
        async with self.retained.held(), self.streams.held():
            yield

    async def summary(self, partition: int) -> dict[str, Any]:
        watch = self.watches.get(partition)
        if watch is None or not watch.ready:
            return ps.summary(await self._collect(partition))
        mark = await self._mark(partition)
        async with self._still(partition):
            digests = await asyncio.to_thread(watch.refresh, *self._stores())
            return digests.summary(partition, self.partitions, mark)

    async def _mark(self, partition: int) -> str:
        return await asyncio.to_thread(ps.mark, *self._stores(), partition, self.bus.epoch or "")

    async def paused(self, partition: int) -> None:
        await asyncio.sleep(0)  # operations of records read before the fence hand over writes
        await asyncio.gather(self.streams.settled(), self.retained.settled())

    async def export(self, request: Request) -> Response:
        """The whole state, or with `?since=<token>` of this instance's watch of the
        partition, only the changes since that state."""
        try:
            partition = self.checked(request)
            serving = partition in self.owner.serving  # not served now: nothing changes it
            since = request.query_params.get("since")
            watch = self.watches.get(partition)
            if since and watch is not None and watch.token == since and watch.ready:
                mark = await self._mark(partition)
                async with self._still(partition):
                    changes = await asyncio.to_thread(watch.changes, *self._stores(), mark)
                return JSONResponse({**pw.to_json(changes), "serving": serving})
            state = await self._watched(partition)
            watch = self.watches.get(partition)
            assert watch is not None
            token = watch.token
        except Refusal as refusal:
            return refusal.response()
        return await unit_response(
            lambda: {**ps.to_json(state), "since": token, "serving": serving}
        )

    def _header(self, partition: int, body: Any) -> None:
        """`Refusal` unless `body` is of `partition` of this topic."""
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

    async def _offered(self, partition: int, body: Any) -> ps.PartitionState:
        """The whole state `body` carries for `partition`, or `Refusal` (read in a worker
        thread: a whole partition runs to tens of thousands of entries)."""
        self._header(partition, body)
        try:
            return await asyncio.to_thread(ps.from_json, body, self._belongs(partition))
        except ValueError as error:
            raise Refusal(400, "BAD_STATE", str(error)) from None

    @asynccontextmanager
    async def _installing_into(self, partition: int) -> AsyncIterator[None]:
        """One install at a time, of a partition not served here; the stores' refusals."""
        async with self._installing:
            self.not_served(partition)
            try:
                yield
            except RetainedFull as error:
                raise Refusal(409, "RETAINED_FULL", str(error)) from None
            except StreamsError as error:
                raise Refusal(400, "BAD_STATE", str(error)) from None

    async def _install(self, state: ps.PartitionState, since: str | None) -> dict[str, Any]:
        """Make the stores hold `state` for its partition and watch it (named `since`, the
        source's name for it, so a catch-up can ask for what changed); the summary once
        durable."""
        new_db = DbSettings(shards=self.streams.settings.shards)
        partition = state.partition
        async with self._installing_into(partition):
            changed = await asyncio.to_thread(
                ps.install, *self._stores(), state, self._belongs(partition), new_db
            )
            if since is None:
                self.watches.stop(partition)
            else:  # what the stores now hold, collected again: the install is checked
                await self._watched(partition, since)
        log.info("handoff_installed", partition=partition, changed=changed)
        return await self.described(partition)

    async def _install_changes(self, changes: pw.Changes, watch: pw.Watch) -> dict[str, Any]:
        new_db = DbSettings(shards=self.streams.settings.shards)
        async with self._installing_into(changes.partition):
            changed = await asyncio.to_thread(pw.install, *self._stores(), changes, watch, new_db)
        log.info("handoff_changes_installed", partition=changes.partition, changed=changed)
        return await self.described(changes.partition)

    async def import_(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            self.not_served(partition)
            body = json_body(await request.body())
            state = await self._offered(partition, body)
            since = body.get("since")
            return JSONResponse(
                await self._install(state, since if isinstance(since, str) else None)
            )
        except Refusal as refusal:
            return refusal.response()

    async def forget(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            self.not_served(partition)
            return JSONResponse(await self._install(ps.empty(partition, self.partitions), None))
        except Refusal as refusal:
            return refusal.response()

    async def _pulled(self, request: Request, *, final: bool) -> JSONResponse:
        """Pull and install the source's state: for a catch-up over a prefetched copy, only
        the changes since, checked against the source's digest (a whole pull if they do not
        give it). `carried`: `retained` (topics written), `deleted`, `messages` (stream
        messages), `whole`, and for a whole pull after changes that did not give the digest,
        `differed`."""
        differed: dict[str, Any] | None = None
        try:
            partition = self.checked(request)
            source = self.source(await request.body())
            self.not_served(partition)
            watch = self.watches.get(partition) if final else None
            since = watch.token if watch is not None and watch.ready else None
            unit = await self.pull(partition, source, final=final, since=since)
            if unit.get("changes") is True and watch is not None:
                self._header(partition, unit)
                try:
                    changes = pw.from_json(unit, self._belongs(partition))
                except ValueError as error:
                    raise Refusal(502, "SOURCE_UNAVAILABLE", f"changes: {error}") from None
                if changes.since == watch.token:
                    answer = await self._install_changes(changes, watch)
                    carried: dict[str, Any] = {
                        "retained": len(changes.retained),
                        "deleted": len(changes.deleted),
                        "messages": len(changes.appended),
                    }
                    if answer["digest"] == changes.digest:
                        return JSONResponse({**answer, "carried": {**carried, "whole": False}})
                    log.warning("handoff_changes_differ", partition=partition, **carried)
                    differed = carried
                unit = await self.pull(partition, source, final=final)
            state = await self._offered(partition, unit)
            since_name = unit.get("since")
            answer = await self._install(state, since_name if isinstance(since_name, str) else None)
        except Refusal as refusal:
            return refusal.response()
        whole = {"retained": len(state.retained), "whole": True, "differed": differed}
        return JSONResponse({**answer, "carried": whole})

    async def prefetch(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=False)

    async def catch_up(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=True)
