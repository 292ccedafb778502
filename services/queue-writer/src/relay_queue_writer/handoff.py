"""Hand-off routes of one command partition (decision 0019, "Hand-off of a queue-writer
partition"), admin token, on the queue-writer's port:

- `GET /internal/partitions/{p}/state`: the partition's mark, digest and counts here, and
  whether this instance serves it (the source after its fence, or the target after an import,
  answers what it holds);
- `GET /internal/partitions/{p}/export`: the partition's state as one JSON unit
  (`relay_queues.partition_state.to_json`), taken between two commands while the instance
  keeps serving (prefetch) or after its fence (the final copy);
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
  pause), so its digest is the final one.

Invariants: every route needs the admin token (403 `FORBIDDEN` while none is set); an
import, a pull or a delete of a partition this instance serves is 409 `PARTITION_SERVED` (its
commands are being applied: replacing its queues under them would lose them); a body that is
not a partition state of this topic (malformed, a digest not its own, another partition count
or a partition other than the path's) is 400 and changes nothing; an import answers once the
installed state is durable, and importing the same unit again gives the same state; an
import or delete waits for an online export's read (`Commands.sweep_lock`); a pause
that would not take the partition from this instance is 400 `NOT_A_MOVE` (and installs
nothing), a source that does not answer an export 502 `SOURCE_UNAVAILABLE`, a catch-up from a
source still serving the partition 409 `SOURCE_SERVING`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus import clients
from relay_bus.fencing import Ownership, Refused
from relay_queue_writer.stores import Stores
from relay_queues import partition_state
from relay_runtime import assignment

PULL_TIMEOUT_S = 60.0


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
    ) -> None:
        self.stores = stores
        self.changes = changes
        """`Commands.sweep_lock`: held by an online export while it reads (`admin`), which sees
        changes only through the command path's `before_change`; an install waits for it."""
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

    def _collect(self, partition: int) -> partition_state.PartitionState:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        return partition_state.collect(journal.journal, store.store, partition, self.partitions)

    def _summary(self, partition: int) -> dict[str, Any]:
        accepted = self.owner.accepted
        return {
            **partition_state.summary([self._collect(partition)])[0],
            "serving": partition in self.owner.serving,
            "generation": None if accepted is None else accepted.generation,
        }

    def _offered(self, partition: int, raw: bytes) -> partition_state.PartitionState:
        """The state the body carries for `partition`, or `_Refusal`."""
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as error:
            raise _Refusal(400, "BAD_JSON", str(error)) from None
        try:
            state = partition_state.from_json(body)
        except ValueError as error:
            raise _Refusal(400, "BAD_STATE", str(error)) from None
        if state.partitions != self.partitions or state.partition != partition:
            raise _Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of partition {state.partition} of {state.partitions}, "
                f"this is partition {partition} of {self.partitions}",
            )
        self._not_served(partition)
        return state

    async def _install(self, state: partition_state.PartitionState) -> dict[str, Any]:
        journal, store = self.stores.journal, self.stores.store
        assert journal is not None
        assert store is not None
        async with self.changes:
            lsn, seq = partition_state.install(journal.journal, store.store, state)
        await journal.durable(lsn)
        await store.durable(seq)
        return self._summary(state.partition)

    async def state(self, request: Request) -> JSONResponse:
        try:
            return JSONResponse(self._summary(self._checked(request)))
        except _Refusal as refusal:
            return refusal.response()

    async def export(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
        except _Refusal as refusal:
            return refusal.response()
        unit = partition_state.to_json(self._collect(partition))
        return JSONResponse({**unit, "serving": partition in self.owner.serving})

    async def import_(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
            state = self._offered(partition, await request.body())
        except _Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._install(state))

    async def forget(self, request: Request) -> JSONResponse:
        try:
            partition = self._checked(request)
            self._not_served(partition)
        except _Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._install(partition_state.empty(partition, self.partitions)))

    async def _pull(self, partition: int, raw: bytes, *, final: bool) -> dict[str, Any]:
        """The source's export of `partition` (from the body's `source` url), or `_Refusal`."""
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as error:
            raise _Refusal(400, "BAD_JSON", str(error)) from None
        source = body.get("source") if isinstance(body, dict) else None
        if not isinstance(source, str) or not source.startswith(("http://", "https://")):
            raise _Refusal(400, "BAD_SOURCE", 'the body is {"source": "http(s)://host:port"}')
        self._not_served(partition)
        url = f"{source.rstrip('/')}/internal/partitions/{partition}/export"
        try:
            if self._client is None:
                self._client = httpx.AsyncClient(timeout=PULL_TIMEOUT_S)
            response = await self._client.get(
                url, headers={"authorization": f"Bearer {self.token}"}
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
        try:
            partition = self._checked(request)
            unit = await self._pull(partition, await request.body(), final=final)
            state = self._offered(partition, json.dumps(unit).encode())
        except _Refusal as refusal:
            return refusal.response()
        return JSONResponse(await self._install(state))

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
        return JSONResponse(self._summary(partition))

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
