"""Hand-off of one command partition (decision 0019, "Hand-off of a queue-writer
partition"): the routes of `relay_bus.handoff_routes` over the queue-writer's engines.

- the export is the partition's state as one JSON unit (`relay_queues.partition_state.to_json`),
  collected a slice of queues at a time while the instance keeps serving (prefetch) or after
  its fence (the final copy), named by the watch it starts (`since`); with `?since=<that
  name>`, only the queues changed since (`partition_state.changes_to_json`, decision 0021);
- a catch-up over a prefetched state asks only for the queues changed since it; if installing
  them does not give the source's whole digest, it pulls the whole state. The answer says what
  was carried (`carried`).

A partition's digest comes from its watch where there is one (`relay_queues.partition_watch`:
the queues changed since it was taken whole are collected again, not the whole partition), so
a pause costs the queues changed since the prefetch, not the partition's size.

Invariants (besides those of `relay_bus.handoff_routes`): a body that is
not a partition state of this topic (malformed, a digest not its own, another partition count
or a partition other than the path's) is 400 and changes nothing; an import answers once the
installed state is durable, and importing the same unit again gives the same state; an
import or delete waits for an online export's read (`Commands.sweep_lock`); collections and
installs yield to the event loop every `SLICE` queues, so the partitions served are served
meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relay_bus.fencing import Ownership
from relay_bus.handoff_routes import PartitionHandoff, Refusal, json_body, unit_response
from relay_journal.journal import QueueJournal
from relay_queue_writer.stores import Stores
from relay_queues import partition_state, partition_watch
from relay_queues.partition_watch import Watches
from relay_storelog.store import StoreLog

log = structlog.get_logger(__name__)

SLICE = 256
"""Queues collected or installed between two yields to the event loop."""


async def _stepped(steps: Iterator[int]) -> int:
    """Run an install's steps, yielding to the event loop every `SLICE`; the last store seq."""
    last = 0
    for n, seq in enumerate(steps, 1):
        last = seq
        if n % SLICE == 0:
            await asyncio.sleep(0)
    return last


class Handoff(PartitionHandoff):
    def __init__(
        self,
        stores: Stores,
        owner: Ownership,
        partitions: int,
        token: str | None,
        changes: asyncio.Lock,
        watches: Watches,
    ) -> None:
        super().__init__(owner, partitions, token)
        self.stores = stores
        self.changes = changes
        """`Commands.sweep_lock`: held by an online export while it reads (`admin`), which sees
        changes only through the command path's `before_change`; an install waits for it."""
        self.watches = watches
        """Shared with `Commands`, which reports every queue it changes."""

    def _engines(self) -> tuple[QueueJournal, StoreLog]:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        return journal.journal, store.store

    async def _collect(
        self, partition: int, *, watch: bool, token: str | None = None
    ) -> tuple[partition_state.PartitionState, partition_watch.Watch | None]:
        """The partition's state, `SLICE` queues at a time (commands of the partitions served
        run in between: the state is a snapshot only of a partition not served), and with
        `watch` a new watch of it (named `token`, or a fresh token), started first, so it sees
        every change made meanwhile."""
        journal, store = self._engines()
        started = self.watches.start(partition, token) if watch else None
        queues = []
        for n, queue_id in enumerate(
            partition_state.queue_ids(store, partition, self.partitions), 1
        ):
            state = partition_state.collect_queue(journal, store, queue_id)
            if state is not None:
                queues.append(state)
                if started is not None:
                    started.held[queue_id] = partition_watch.Held.of(state)
            if n % SLICE == 0:
                await asyncio.sleep(0)
        mark = journal.marks.get(partition_state.mark_key(partition), "")
        return partition_state.PartitionState(partition, self.partitions, mark, tuple(queues)), (
            started
        )

    async def paused(self, partition: int) -> None:
        """Nothing to wait for: a command's changes reach the engines before its handler
        returns, and the fence waited for the handler in progress (an import or the export
        waits for durability itself)."""

    async def summary(self, partition: int) -> dict[str, Any]:
        watch = self.watches.get(partition)
        if watch is not None:
            return watch.summary(*self._engines())
        state, _ = await self._collect(partition, watch=False)
        return partition_state.summary([state])[0]

    def _offered(
        self, partition: int, body: Any
    ) -> partition_state.PartitionState | partition_state.Changes:
        """The state or changes `body` carries for `partition`, or `Refusal`."""
        try:
            offered = partition_state.from_json(body)
        except ValueError as error:
            raise Refusal(400, "BAD_STATE", str(error)) from None
        if offered.partitions != self.partitions or offered.partition != partition:
            raise Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of partition {offered.partition} of {offered.partitions}, "
                f"this is partition {partition} of {self.partitions}",
            )
        self.not_served(partition)
        return offered

    async def _durable(self, seq: int) -> None:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        await journal.durable(journal.journal.wal.written_lsn)
        await store.durable(seq)

    async def _install(
        self, state: partition_state.PartitionState, since: str | None, *, watch: bool = True
    ) -> dict[str, Any]:
        """Install a whole state, `SLICE` queues at a time, then watch what is held (named
        `since`, the source's name for the state, so a catch-up can ask for what changed)."""
        journal, store = self._engines()
        partition = state.partition
        async with self.changes:
            known = self.watches.get(partition)
            if known is not None:
                now = known.now(journal, store).held
                held = {queue_id: h.digest for queue_id, h in now.items()}
            else:
                found, _ = await self._collect(partition, watch=False)
                held = {
                    q.record.recipient_id: partition_state.queue_digest(q) for q in found.queues
                }
            seq = await _stepped(partition_state.installing(journal, store, state, held))
            if watch:  # what the engines now hold, collected again: the install is checked
                await self._collect(partition, watch=True, token=since)
            else:
                self.watches.stop(partition)
        await self._durable(seq)
        return await self.described(partition)

    async def _install_changes(
        self, changes: partition_state.Changes, watch: partition_watch.Watch
    ) -> dict[str, Any]:
        """Install changes over the whole state `watch` holds (the one they are since)."""
        journal, store = self._engines()
        async with self.changes:
            held = {queue_id: h.digest for queue_id, h in watch.now(journal, store).held.items()}
            steps = partition_state.installing_changes(journal, store, changes, held)
            seq = await _stepped(steps)
            watch.changed.update(q.record.recipient_id for q in changes.queues)
            watch.changed.update(changes.deleted)
            watch.refresh(journal, store)
        await self._durable(seq)
        return await self.described(changes.partition)

    async def export(self, request: Request) -> Response:
        """The whole state (built and encoded in a worker thread: `unit_response`), or with
        `?since=<token>` of this instance's watch of the partition, only the queues changed
        since that state."""
        try:
            partition = self.checked(request)
        except Refusal as refusal:
            return refusal.response()
        serving = partition in self.owner.serving  # not served now: nothing changes it
        since = request.query_params.get("since")
        watch = self.watches.get(partition)
        if since and watch is not None and watch.token == since:
            unit = partition_state.changes_to_json(watch.changes(*self._engines()))
            return JSONResponse({**unit, "serving": serving})
        state, started = await self._collect(partition, watch=True)
        assert started is not None
        token = started.token
        return await unit_response(
            lambda: {**partition_state.to_json(state, since=token), "serving": serving}
        )

    async def import_(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            body = json_body(await request.body())
            offered = self._offered(partition, body)
            if isinstance(offered, partition_state.Changes):
                raise Refusal(400, "BAD_STATE", "an import takes a whole state, not changes")
        except Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._install(offered, body.get("since")))

    async def forget(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            self.not_served(partition)
        except Refusal as refusal:
            return refusal.response()
        empty = partition_state.empty(partition, self.partitions)
        return JSONResponse(await self._install(empty, None, watch=False))

    async def _pulled(self, request: Request, *, final: bool) -> JSONResponse:
        """Pull and install the source's state: for a catch-up over a prefetched state, only
        the queues changed since, checked against the source's whole digest (a whole pull if
        they do not give it). The answer's `carried` says what came: `queues`, `deleted`,
        `whole`, and for a whole pull after changes that did not give the digest, `differed`."""
        differed = None
        try:
            partition = self.checked(request)
            source = self.source(await request.body())
            self.not_served(partition)
            watch = self.watches.get(partition) if final else None
            since = None if watch is None else watch.token
            unit = await self.pull(partition, source, final=final, since=since)
            offered = self._offered(partition, unit)
            if isinstance(offered, partition_state.Changes):
                if watch is not None and offered.since == watch.token:
                    answer = await self._install_changes(offered, watch)
                    carried = {"queues": len(offered.queues), "deleted": len(offered.deleted)}
                    if answer["digest"] == offered.digest:
                        return JSONResponse({**answer, "carried": {**carried, "whole": False}})
                    log.warning("handoff_changes_differ", partition=partition, **carried)
                    differed = carried
                unit = await self.pull(partition, source, final=final, since=None)
                offered = self._offered(partition, unit)
            if isinstance(offered, partition_state.Changes):
                raise Refusal(502, "SOURCE_UNAVAILABLE", "changes answered a whole pull")
        except Refusal as refusal:
            return refusal.response()
        answer = await self._install(offered, unit.get("since"))
        carried = {"queues": len(offered.queues), "deleted": 0, "whole": True}
        return JSONResponse({**answer, "carried": {**carried, "differed": differed}})

    async def prefetch(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=False)

    async def catch_up(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=True)
