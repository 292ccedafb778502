"""This replicator as a replica: the writes and reads a coordinator sends it, whether from this
process (a direct call) or from another replicator (the internal HTTP routes below).

Routes (admin bearer token when `RELAY_ADMIN_TOKEN` is set; peers use it):
- `GET /internal/kv/site`: this replicator's site id;
- `POST /internal/kv/write` `{"items": [{"n", "ns", "key", "value"}], "hint_for"?}`: merge each
  value into the store (or keep it as a hint for `hint_for`) and answer once fsynced;
- `POST /internal/kv/read` `{"items": [{"n", "ns", "key"}]}`: the stored values, tombstones
  included (internal reads see them);
- `POST /internal/kv/rows` `{"n", "ns", "key", "after"?, "limit"}`: a page of a set's member
  rows (`relay_kv.setrows`), tombstones included, and whether more follow;
- `POST /internal/kv/tree/groups`, `/tree/shards`, `/tree/keys`: anti-entropy
  (`relay_replicator.sync`); `/tree/held`: per replication factor, the shards holding data
  here (what a site joining a shard's home set pulls, `relay_replicator.changes`).

Invariants: a write whose version is further ahead of this site's clock than the allowed skew is
refused whole (409, nothing stored); an accepted version is observed by this site's clock (so
its own later stamps are greater); an answer is sent only after the batch holding the write is
on disk.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_kv import codec, crdt, hints, ops, placement
from relay_kv.clock import HybridClock, TooFarAhead
from relay_replicator.store import KvStore, Write


class Refused(Exception):
    """A write this replica will not take (a version too far ahead, hints full)."""


class Item(BaseModel):
    n: int = Field(ge=1, le=7)
    ns: str
    key: str
    value: dict[str, Any] | None = None


class WriteBody(BaseModel):
    items: list[Item]
    hint_for: str | None = None


class ReadBody(BaseModel):
    items: list[Item]


class RowsBody(BaseModel):
    n: int = Field(ge=1, le=7)
    ns: str
    key: str
    after: str | None = None
    limit: int = Field(ge=1, le=10_000)


class LocalReplica:
    def __init__(self, site: str, store: KvStore, clock: HybridClock, now_ms: Any) -> None:
        self.site = site
        self.store = store
        self.clock = clock
        self.now_ms = now_ms

    async def write(
        self, items: list[tuple[int, str, str, crdt.Value]], hint_for: str | None = None
    ) -> list[dict[str, Any]]:
        """Merge (or hint) `items` = (n, namespace, key, value); per item `{"newer", "type",
        "live"}` (for a hint, empty)."""
        for _, _, _, value in items:
            for version in ops.versions(value):
                if not self.clock.admissible(version):
                    raise Refused(f"version {version} is too far ahead of site {self.site}")
        for _, _, _, value in items:
            for version in ops.versions(value):
                try:
                    self.clock.observe(version)
                except TooFarAhead as error:
                    raise Refused(str(error)) from None
        if hint_for is not None:
            now = self.now_ms()
            kept = await self.store.add_hints(
                [hints.Hint(hint_for, n, ns, key, value, now) for n, ns, key, value in items]
            )
            if not kept:
                raise Refused(f"hints full on site {self.site}")
            return [{} for _ in items]
        applied = await self.store.merge(
            [Write(n, placement.shard_of(ns, key), ns, key, value) for n, ns, key, value in items]
        )
        now = self.now_ms()
        return [
            {
                "newer": None if a.newer is None else str(a.newer),
                "type": ops.type_name(a.stored),
                "live": crdt.is_live(a.stored, now),
            }
            for a in applied
        ]

    def read(self, items: list[tuple[int, str, str]]) -> list[crdt.Value | None]:
        return [self.store.get(n, placement.shard_of(ns, key), ns, key) for n, ns, key in items]

    def rows(
        self, n: int, ns: str, key: str, after: str | None, limit: int
    ) -> tuple[list[tuple[str, crdt.Value]], bool]:
        found, more = self.store.rows(n, ns, key, after, limit)
        return [(row, codec.decode(raw)) for row, raw in found], more


def routes(replica: LocalReplica, token: str | None, sync: Any) -> list[BaseRoute]:
    """The replica's routes (plain Starlette: each body is validated by its own model, and the
    replicator imports no FastAPI, a third of its start)."""

    def endpoint(
        handle: Callable[[Any], Awaitable[dict[str, Any]]], model: type[BaseModel] | None = None
    ) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def run(request: Request) -> JSONResponse:
            if not authorized(request, token):
                return _error(403, "FORBIDDEN", "admin token missing or wrong")
            raw = await request.body()
            try:
                if model is not None:
                    body: Any = model.model_validate_json(raw)
                else:
                    body = orjson.loads(raw) if raw else {}
                    if not isinstance(body, dict):
                        raise ValueError("the body must be a JSON object")
                return JSONResponse(await handle(body))
            except Refused as error:
                return _error(409, "CONFLICT", str(error))
            except (ValueError, KeyError, TypeError, IndexError) as error:
                return _error(400, "BAD_REQUEST", str(error))

        return run

    async def site(_: Any) -> dict[str, Any]:
        return {"site": replica.site}

    async def write(body: WriteBody) -> dict[str, Any]:
        if any(i.value is None for i in body.items):
            raise ValueError("every item of a write needs a value")
        items = [(i.n, i.ns, i.key, codec.from_json(i.value or {})) for i in body.items]
        return {"results": await replica.write(items, body.hint_for)}

    async def read(body: ReadBody) -> dict[str, Any]:
        values = replica.read([(i.n, i.ns, i.key) for i in body.items])
        return {"values": [None if v is None else codec.to_json(v) for v in values]}

    async def rows(body: RowsBody) -> dict[str, Any]:
        found, more = replica.rows(body.n, body.ns, body.key, body.after, body.limit)
        return {"rows": [[row, codec.to_json(value)] for row, value in found], "more": more}

    async def scan(body: dict[str, Any]) -> dict[str, Any]:
        """This replica's keys of one namespace (tombstones included), paged by (shard, key)."""
        after = body.get("after")
        found = replica.store.scan(
            int(body["n"]),
            str(body["ns"]),
            None if after is None else (int(after[0]), str(after[1])),
            min(int(body.get("limit", 1000)), 1000),
        )
        return {
            "keys": [
                {"shard": shard, "key": key, "value": codec.to_json(codec.decode(raw))}
                for shard, key, raw in found
            ]
        }

    async def groups(body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = sync.groups(int(body["n"]), str(body["peer"]))
        return result

    async def shards(body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = sync.shards(
            int(body["n"]), str(body["peer"]), [int(g) for g in body["groups"]]
        )
        return result

    async def held(_: Any) -> dict[str, Any]:
        return {"classes": {str(n): sorted(t.shards) for n, t in replica.store.tree.items()}}

    async def keys(body: dict[str, Any]) -> dict[str, Any]:
        if "shard" in body:  # a peer of the version that asked one shard at a time
            rows = sync.keys(int(body["n"]), [int(body["shard"])])["keys"]
            return {"keys": [row[1:] for row in rows]}
        after = body.get("after")
        limit = body.get("limit")
        result: dict[str, Any] = sync.keys(
            int(body["n"]),
            [int(s) for s in body["shards"]],
            None if after is None else (int(after[0]), str(after[1]), str(after[2])),
            None if limit is None else max(1, min(int(limit), 100_000)),
        )
        return result

    return [
        Route("/internal/kv/site", endpoint(site), methods=["GET"]),
        Route("/internal/kv/write", endpoint(write, WriteBody), methods=["POST"]),
        Route("/internal/kv/read", endpoint(read, ReadBody), methods=["POST"]),
        Route("/internal/kv/rows", endpoint(rows, RowsBody), methods=["POST"]),
        Route("/internal/kv/scan", endpoint(scan), methods=["POST"]),
        Route("/internal/kv/tree/groups", endpoint(groups), methods=["POST"]),
        Route("/internal/kv/tree/shards", endpoint(shards), methods=["POST"]),
        Route("/internal/kv/tree/held", endpoint(held), methods=["POST"]),
        Route("/internal/kv/tree/keys", endpoint(keys), methods=["POST"]),
    ]


def authorized(request: Request, token: str | None) -> bool:
    """Whether the request presents the admin token (always, when none is set)."""
    if token is None:
        return True
    presented = request.headers.get("authorization", "").encode()
    return hmac.compare_digest(presented, f"Bearer {token}".encode())


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)
