"""The partition hand-off's routes as every stateful service serves them (decision 0019, "The
move"; the queue-writer's and the retainer's), admin token, on the service's port:

- `GET /internal/partitions/{p}/state`: the partition's mark, digest and counts here, whether
  this instance serves it, and the generation it accepted;
- `GET .../export`: the partition's data as one JSON unit, with `serving`;
- `PUT .../import`: install such a unit, answer the state once durable;
- `DELETE /internal/partitions/{p}`: forget the partition's data;
- `POST .../pause` (source): install the assignment in the body, which must take the
  partition from this instance (the fence of `PUT /internal/ownership`), and answer the state
  as it stays from then on;
- `POST .../prefetch` and `.../catch-up` (target), `{"source": url}`: pull the source's export
  (with this instance's admin token, the pool's) and install it; a catch-up takes only an
  export the source made while not serving the partition (after its pause).

What a partition's data is, and how it is collected and installed, is the service's
(`PartitionHandoff`'s abstract methods); this module keeps what the routes share.

Invariants: every route needs the admin token (403 `FORBIDDEN` while none is set); a path's
partition outside the topic is 400 `BAD_PARTITION`; an import, a pull or a delete of a
partition this instance serves is 409 `PARTITION_SERVED`; a pause that would not take the
partition from this instance is 400 `NOT_A_MOVE` and installs nothing; a source that does not
answer an export is 502 `SOURCE_UNAVAILABLE`, a catch-up from a source still serving the
partition 409 `SOURCE_SERVING`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from relay_bus import clients
from relay_bus.fencing import Ownership, Refused
from relay_runtime import assignment

PULL_TIMEOUT_S = 60.0


class Refusal(Exception):
    """An answer other than 200: its status, code and detail."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.code, "detail": self.detail}, status_code=self.status)


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sliced(value: Any, depth: int = 3) -> Iterator[str]:
    """`value` as JSON text in pieces: lists and objects down to `depth` are walked, each
    element encoded on its own. The C encoder holds the GIL for a whole call, so one call
    over a unit of tens of MB stopped every thread of the process, the event loop's
    included, for as long; between pieces the interpreter may switch threads."""
    if depth and isinstance(value, list):
        yield "["
        for n, item in enumerate(value):
            if n:
                yield ","
            yield from sliced(item, depth - 1)
        yield "]"
    elif depth and isinstance(value, dict):
        yield "{"
        for n, (key, item) in enumerate(value.items()):
            yield ("," if n else "") + _ENCODE(str(key)) + ":"
            yield from sliced(item, depth - 1)
        yield "}"
    else:
        yield _ENCODE(value)


async def unit_response(make: Callable[[], dict[str, Any]]) -> Response:
    """A JSON answer made and encoded (`sliced`) in a worker thread: a whole partition's unit
    runs to tens of MB (a quarter of 100,000 retained topics and stream messages: 18.5 MB),
    and the partitions served meanwhile must not wait for it. `make` reads only what nothing
    changes meanwhile."""

    def encoded() -> bytes:
        return "".join(sliced(make())).encode()

    return Response(await asyncio.to_thread(encoded), media_type="application/json")


def json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as error:
        raise Refusal(400, "BAD_JSON", str(error)) from None


class PartitionHandoff(ABC):
    def __init__(self, owner: Ownership, partitions: int, token: str | None) -> None:
        self.owner = owner
        self.partitions = partitions
        self.token = token
        self._client: httpx.AsyncClient | None = None
        """For pulls from a source, made at the first (its SSL context costs tens of ms)."""

    # -- what the service provides ---------------------------------------------------------

    @abstractmethod
    async def summary(self, partition: int) -> dict[str, Any]:
        """`{partition, mark, digest, ...counts}` of what is held here now."""

    @abstractmethod
    async def export(self, request: Request) -> Response: ...

    @abstractmethod
    async def import_(self, request: Request) -> JSONResponse: ...

    @abstractmethod
    async def forget(self, request: Request) -> JSONResponse: ...

    @abstractmethod
    async def prefetch(self, request: Request) -> JSONResponse: ...

    @abstractmethod
    async def catch_up(self, request: Request) -> JSONResponse: ...

    @abstractmethod
    async def paused(self, partition: int) -> None:
        """Called once the fence took `partition` from here, before the pause answers: return
        once whatever of it was still being written is durable."""

    # -- shared ----------------------------------------------------------------------------

    def checked(self, request: Request) -> int:
        """The path's partition, or `Refusal` (no token, a partition not of this topic)."""
        presented = request.headers.get("authorization", "").encode()
        if self.token is None or not hmac.compare_digest(
            presented, f"Bearer {self.token}".encode()
        ):
            raise Refusal(403, "FORBIDDEN", "admin token")
        raw = request.path_params["partition"]
        if not raw.isdigit() or int(raw) >= self.partitions:
            raise Refusal(400, "BAD_PARTITION", f"partition is 0..{self.partitions - 1}")
        return int(raw)

    def not_served(self, partition: int) -> None:
        if partition in self.owner.serving:
            raise Refusal(409, "PARTITION_SERVED", f"partition {partition} is served here")

    async def described(self, partition: int) -> dict[str, Any]:
        """`summary` with whether this instance serves the partition, and its generation."""
        accepted = self.owner.accepted
        return {
            **(await self.summary(partition)),
            "serving": partition in self.owner.serving,
            "generation": None if accepted is None else accepted.generation,
        }

    async def state(self, request: Request) -> JSONResponse:
        try:
            return JSONResponse(await self.described(self.checked(request)))
        except Refusal as refusal:
            return refusal.response()

    @staticmethod
    def source(raw: bytes) -> str:
        body = json_body(raw)
        source = body.get("source") if isinstance(body, dict) else None
        if not isinstance(source, str) or not source.startswith(("http://", "https://")):
            raise Refusal(400, "BAD_SOURCE", 'the body is {"source": "http(s)://host:port"}')
        return source

    async def pull(
        self, partition: int, source: str, *, final: bool, since: str | None = None
    ) -> dict[str, Any]:
        """The source's export of `partition` (with `since`, what the service's export makes of
        it), without its `serving`; `Refusal`."""
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
            raise Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: {error}") from None
        if response.status_code != 200:
            raise Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: {response.status_code}")
        try:
            unit = await asyncio.to_thread(json.loads, response.content)  # tens of MB
        except ValueError:
            raise Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: not JSON") from None
        if not isinstance(unit, dict):
            raise Refusal(502, "SOURCE_UNAVAILABLE", f"{url}: not a partition state")
        if final and unit.get("serving") is not False:
            raise Refusal(409, "SOURCE_SERVING", f"the source still serves partition {partition}")
        return {key: value for key, value in unit.items() if key != "serving"}

    async def _move(self, partition: int, raw: bytes) -> None:
        """Install the assignment `raw` carries if it takes `partition` from here; `Refusal`."""
        body = json_body(raw)
        try:
            if not isinstance(body, dict):
                raise assignment.InvalidAssignment("BAD_ASSIGNMENT", "the body is a JSON object")
            offered = assignment.parse(body, self.partitions)
        except assignment.InvalidAssignment as error:
            raise Refusal(400, error.code, str(error)) from None
        if offered.owners[partition] == self.owner.ordinal:
            raise Refusal(400, "NOT_A_MOVE", f"the assignment leaves partition {partition} here")
        try:
            await self.owner.install(offered)
        except Refused as refused:
            raise Refusal(409, refused.code, refused.detail) from None
        except clients.KafkaError as error:
            raise Refusal(503, "UNAVAILABLE", f"relay.ownership: {error}; again") from None

    async def pause(self, request: Request) -> JSONResponse:
        try:
            partition = self.checked(request)
            await self._move(partition, await request.body())
        except Refusal as refusal:
            return refusal.response()
        await self.paused(partition)
        return JSONResponse(await self.described(partition))

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
