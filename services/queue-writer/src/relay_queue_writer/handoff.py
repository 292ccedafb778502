"""Hand-off routes of one command partition (decision 0019, "Hand-off of a queue-writer
partition"), admin token, on the queue-writer's port:

- `GET /internal/partitions/{p}/state`: the partition's mark, digest and counts here, and
  whether this instance serves it (the source after its fence, or the target after an import,
  answers what it holds);
- `GET /internal/partitions/{p}/export`: the partition's state as one JSON unit
  (`relay_queues.partition_state.to_json`), collected a slice of queues at a time while the
  instance keeps serving (prefetch) or after its fence (the final copy), named by the watch it
  starts (`since`); with `?since=<that name>`, only the queues changed since
  (`partition_state.changes_to_json`, decision 0021);
- `PUT /internal/partitions/{p}/import`: install such a unit here through the engines, and
  answer the digest of what is now held;
- `DELETE /internal/partitions/{p}`: forget the partition's queues and mark (a source once
  the move committed and its keeping time is over, or a target whose move was rolled back);
- `POST /internal/partitions/{p}/pause` (source): install the new generation, which must
  take the partition from this instance (`PUT /internal/ownership`'s fence), and answer the
  partition's mark and digest as they stay from then on;
- `POST /internal/partitions/{p}/prefetch` and `.../catch-up` (target), `{"source": url}`:
  pull the source's export (with this instance's admin token, the pool's) and import it; a
  catch-up takes only an export the source made while not serving the partition (after its
  pause), so its digest is the final one. A catch-up over a prefetched state asks only for
  the queues changed since it; if installing them does not give the source's whole digest,
  it pulls the whole state. The answer says what was carried (`carried`).

A partition's digest comes from its watch where there is one (`relay_queues.partition_watch`:
the queues changed since it was taken whole are collected again, not the whole partition), so
a pause costs the queues changed since the prefetch, not the partition's size.

Invariants: every route needs the admin token (403 `FORBIDDEN` while none is set); an
import, a pull or a delete of a partition this instance serves is 409 `PARTITION_SERVED` (its
commands are being applied: replacing its queues under them would lose them); a body that is
not a partition state of this topic (malformed, a digest not its own, another partition count
or a partition other than the path's) is 400 and changes nothing; an import answers once the
installed state is durable, and importing the same unit again gives the same state; an
import or delete waits for an online export's read (`Commands.sweep_lock`); collections and
installs yield to the event loop every `SLICE` queues, so the partitions served are served
meanwhile; a pause
that would not take the partition from this instance is 400 `NOT_A_MOVE` (and installs
nothing), a source that does not answer an export 502 `SOURCE_UNAVAILABLE`, a catch-up from a
source still serving the partition 409 `SOURCE_SERVING`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Iterator
from typing import Any

import httpx
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus import clients
from relay_bus.fencing import Ownership, Refused
from relay_journal.journal import QueueJournal
from relay_queue_writer.stores import Stores
from relay_queues import partition_state, partition_watch
from relay_queues.partition_watch import Watches
from relay_runtime import assignment
from relay_storelog.store import StoreLog

log = structlog.get_logger(__name__)

PULL_TIMEOUT_S = 60.0
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


class _Refusal(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "detail": self.detail}, status_code=self.status)


class Handoff:
    def __init__(
        self,
        stores: Stores,
        owner: Ownership,
        partitions: int,
        token: str | None,
        changes: asyncio.Lock,
        watches: Watches,
    ) -> None:
        self.stores = stores
        self.changes = changes
        """`Commands.sweep_lock`: held by an online export while it reads (`admin`), which sees
        changes only through the command path's `before_change`; an install waits for it."""
        self.watches = watches
        """Shared with `Commands`, which reports every queue it changes."""
        self.owner = owner
        self.partitions = partitions
        self.token = token
        self._client: httpx.AsyncClient | None = None
        """For pulls from a source, made at the first (its SSL context costs tens of ms)."""

    def _checked(self, request: Request) -> int:
        """The path's partition, or `_Refusal` (no token, a partition not of this topic)."""
        presented = request.headers.get("authorization", "").encode()
        if self.token is None or not hmac.compare_digest(
            presented, f"Bearer {self.token}".encode()
        ):
            raise _Refusal(403, "FORBIDDEN", "admin token")
        raw = request.path_params["partition"]
        if not raw.isdigit() or int(raw) >= self.partitions:
            raise _Refusal(400, "BAD_PARTITION", f"partition is 0..{self.partitions - 1}")
        return int(raw)

    def _not_served(self, partition: int) -> None:
        if partition in self.owner.serving:
            raise _Refusal(409, "PARTITION_SERVED", f"partition {partition} is served here")

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

    async def _summary(self, partition: int) -> dict[str, Any]:
        watch = self.watches.get(partition)
        if watch is not None:
            found = watch.summary(*self._engines())
        else:
            state, _ = await self._collect(partition, watch=False)
            found = partition_state.summary([state])[0]
        accepted = self.owner.accepted
        return {
            **found,
            "serving": partition in self.owner.serving,
            "generation": None if accepted is None else accepted.generation,
        }

    def _offered(
        self, partition: int, body: Any
    ) -> partition_state.PartitionState | partition_state.Changes:
        """The state or changes `body` carries for `partition`, or `_Refusal`."""
        try:
            offered = partition_state.from_json(body)
        except ValueError as error:
            raise _Refusal(400, "BAD_STATE", str(error)) from None
        if offered.partitions != self.partitions or offered.partition != partition:
            raise _Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of partition {offered.partition} of {offered.partitions}, "
                f"this is partition {partition} of {self.partitions}",
            )
        self._not_served(partition)
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
        return await self._summary(partition)

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
        return await self._summary(changes.partition)

    async def state(self, request: Request) -> JSONResponse:
        try:
            return JSONResponse(await self._summary(self._checked(request)))
        except _Refusal as refusal:
            return refusal.response()

    async def export(self, request: Request) -> JSONResponse:
        """The whole state, or with `?since=<token>` of this instance's watch of the
        partition, only the queues changed since that state."""
        try:
            partition = self._checked(request)
        except _Refusal as refusal:
            return refusal.response()
        serving = partition in self.owner.serving  # not served now: nothing changes it
        since = request.query_params.get("since")
        watch = self.watches.get(partition)
        if since and watch is not None and watch.token == since:
            unit = partition_state.changes_to_json(watch.changes(*self._engines()))
        else:
            state, started = await self._collect(partition, watch=True)
            assert started is not None
            unit = partition_state.to_json(state, since=started.token)
        return JSONResponse({**unit, "serving": serving})

    async def import_(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
            try:
                body = json.loads(await request.body())
            except json.JSONDecodeError as error:
                raise _Refusal(400, "BAD_JSON", str(error)) from None
            offered = self._offered(partition, body)
            if isinstance(offered, partition_state.Changes):
                raise _Refusal(400, "BAD_STATE", "an import takes a whole state, not changes")
        except _Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._install(offered, body.get("since")))

    async def forget(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
            self._not_served(partition)
        except _Refusal as refusal:
            return refusal.response()
        empty = partition_state.empty(partition, self.partitions)
        return JSONResponse(await self._install(empty, None, watch=False))

    def _source(self, raw: bytes) -> str:
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as error:
            raise _Refusal(400, "BAD_JSON", str(error)) from None
        source = body.get("source") if isinstance(body, dict) else None
        if not isinstance(source, str) or not source.startswith(("http://", "https://")):
            raise _Refusal(400, "BAD_SOURCE", 'the body is {"source": "http(s)://host:port"}')
        return source

    async def _pull(
        self, partition: int, source: str, *, final: bool, since: str | None
    ) -> dict[str, Any]:
        """The source's export of `partition` (only what changed since `since`, if the source
        still knows that name), or `_Refusal`."""
        url = f"{source.rstrip('/')}/internal/partitions/{partition}/export"
        try:
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=PULL_TIMEOUT_S)
            response = await self._client.get(
                url,
                params={} if since is None else {"since": since},
                headers={"authorization": f"Bearer {self.token}"},
            )
        except httpx.HTTPError as error:
            raise _Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: {error}") from None
        if response.status_code != 200:
            raise _Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: {response.status_code}")
        unit = response.json()
        if not isinstance(unit, dict):
            raise _Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: not a partition state")
        if final and unit.get("serving") is not False:
            raise _Refusal(409, "SOURCE_SERVING", f"the source still serves partition {partition}")
        return {key: value for key, value in unit.items() if key != "serving"}

    async def _pulled(self, request: Request, *, final: bool) -> JSONResponse:
        """Pull and install the source's state: for a catch-up over a prefetched state, only
        the queues changed since, checked against the source's whole digest (a whole pull if
        they do not give it). The answer's `carried` says what came: `queues`, `deleted`,
        `whole`, and for a whole pull after changes that did not give the digest, `differed`."""
        differed = None
        try:
            partition = self._checked(request)
            source = self._source(await request.body())
            self._not_served(partition)
            watch = self.watches.get(partition) if final else None
            since = None if watch is None else watch.token
            unit = await self._pull(partition, source, final=final, since=since)
            offered = self._offered(partition, unit)
            if isinstance(offered, partition_state.Changes):
                if watch is not None and offered.since == watch.token:
                    answer = await self._install_changes(offered, watch)
                    carried = {"queues": len(offered.queues), "deleted": len(offered.deleted)}
                    if answer["digest"] == offered.digest:
                        return JSONResponse({**answer, "carried": {**carried, "whole": False}})
                    log.warning("handoff_changes_differ", partition=partition, **carried)
                    differed = carried
                unit = await self._pull(partition, source, final=final, since=None)
                offered = self._offered(partition, unit)
            if isinstance(offered, partition_state.Changes):
                raise _Refusal(502, "SOURCE_UNAVAILABLE", "changes answered a whole pull")
        except _Refusal as refusal:
            return refusal.response()
        answer = await self._install(offered, unit.get("since"))
        carried = {"queues": len(offered.queues), "deleted": 0, "whole": True}
        return JSONResponse({**answer, "carried": {**carried, "differed": differed}})

    async def prefetch(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=False)

    async def catch_up(self, request: Request) -> JSONResponse:
        return await self._pulled(request, final=True)

    async def _move(self, partition: int, raw: bytes) -> None:
        """Install the assignment `raw` carries if it takes `partition` from here; `_Refusal`."""
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise assignment.InvalidAssignment("BAD_ASSIGNMENT", "the body is a JSON object")
            offered = assignment.parse(body, self.partitions)
        except json.JSONDecodeError as error:
            raise _Refusal(400, "BAD_JSON", str(error)) from None
        except assignment.InvalidAssignment as error:
            raise _Refusal(400, error.code, str(error)) from None
        if offered.owners[partition] == self.owner.ordinal:
            raise _Refusal(400, "NOT_A_MOVE", f"the assignment leaves partition {partition} here")
        try:
            await self.owner.install(offered)
        except Refused as refused:
            raise _Refusal(409, refused.code, refused.detail) from None
        except clients.KafkaError as error:
            raise _Refusal(503, "UNAVAILABLE", f"relay.ownership: {error}; again") from None

    async def pause(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
            await self._move(partition, await request.body())
        except _Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._summary(partition))

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/internal/partitions/{partition}/state", self.state, methods=["GET"]),
            Route("/internal/partitions/{partition}/export", self.export, methods=["GET"]),
            Route("/internal/partitions/{partition}/import", self.import_, methods=["PUT"]),
            Route("/internal/partitions/{partition}", self.forget, methods=["DELETE"]),
            Route("/internal/partitions/{partition}/pause", self.pause, methods=["POST"]),
            Route("/internal/partitions/{partition}/prefetch", self.prefetch, methods=["POST"]),
            Route("/internal/partitions/{partition}/catch-up", self.catch_up, methods=["POST"]),
        ]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
