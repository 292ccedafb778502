"""Hand-off routes of one command partition (decision 0019, "Hand-off of a queue-writer
partition"), admin token, on the queue-writer's port:

- `GET /internal/partitions/{p}/state`: the partition's mark, digest and counts here, and
  whether this instance serves it (the source after its fence, or the target after an import,
  answers what it holds);
- `GET /internal/partitions/{p}/export`: the partition's state as one JSON unit
  (`relay_queues.partition_state.to_json`), taken between two commands while the instance
  keeps serving (prefetch) or after its fence (the final copy);
- `PUT /internal/partitions/{p}/import`: install such a unit here through the engines, and
  answer the digest of what is now held.

Invariants: every route needs the admin token (403 `FORBIDDEN` while none is set); an import
of a partition this instance serves is 409 `PARTITION_SERVED` (its commands are being
applied: replacing its queues under them would lose them); a body that is not a partition
state of this topic (malformed, a digest not its own, another partition count or a partition
other than the path's) is 400 and changes nothing; an import answers once the installed state
is durable, and importing the same unit again gives the same state.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from relay_bus.fencing import Ownership
from relay_queue_writer.stores import Stores
from relay_queues import partition_state


class _Refusal(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def _error(status: int, code: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


def handoff_routes(
    stores: Stores, owner: Ownership, partitions: int, token: str | None
) -> list[BaseRoute]:
    def allowed(request: Request) -> bool:
        presented = request.headers.get("authorization", "").encode()
        return token is not None and hmac.compare_digest(presented, f"Bearer {token}".encode())

    def partition_of(request: Request) -> int | JSONResponse:
        raw = request.path_params["partition"]
        if not raw.isdigit() or int(raw) >= partitions:
            return _error(400, "BAD_PARTITION", f"partition is 0..{partitions - 1}")
        return int(raw)

    def collect(partition: int) -> partition_state.PartitionState:
        journal, store = stores.journal, stores.store
        assert journal is not None
        assert store is not None
        return partition_state.collect(journal.journal, store.store, partition, partitions)

    def summary(state: partition_state.PartitionState) -> dict[str, Any]:
        return {
            **partition_state.summary([state])[0],
            "serving": state.partition in owner.serving,
            "generation": None if owner.accepted is None else owner.accepted.generation,
        }

    async def state(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        partition = partition_of(request)
        if isinstance(partition, JSONResponse):
            return partition
        return JSONResponse(summary(collect(partition)))

    async def export(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        partition = partition_of(request)
        if isinstance(partition, JSONResponse):
            return partition
        return JSONResponse(partition_state.to_json(collect(partition)))

    def offered(partition: int, raw: bytes) -> partition_state.PartitionState:
        """The state the body carries for `partition`, or `_Refusal`."""
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as error:
            raise _Refusal(400, "BAD_JSON", str(error)) from None
        try:
            state = partition_state.from_json(body)
        except ValueError as error:
            raise _Refusal(400, "BAD_STATE", str(error)) from None
        if state.partitions != partitions or state.partition != partition:
            raise _Refusal(
                400,
                "PARTITION_MISMATCH",
                f"the state is of partition {state.partition} of {state.partitions}, "
                f"this is partition {partition} of {partitions}",
            )
        if partition in owner.serving:
            raise _Refusal(409, "PARTITION_SERVED", f"partition {partition} is served here")
        return state

    async def import_(request: Request) -> JSONResponse:
        if not allowed(request):
            return _error(403, "FORBIDDEN", "admin token")
        partition = partition_of(request)
        if isinstance(partition, JSONResponse):
            return partition
        try:
            state = offered(partition, await request.body())
        except _Refusal as refusal:
            return _error(refusal.status, refusal.code, refusal.detail)
        journal, store = stores.journal, stores.store
        assert journal is not None
        assert store is not None
        lsn, seq = partition_state.install(journal.journal, store.store, state)
        await journal.durable(lsn)
        await store.durable(seq)
        return JSONResponse(summary(collect(partition)))

    return [
        Route("/internal/partitions/{partition}/state", state, methods=["GET"]),
        Route("/internal/partitions/{partition}/export", export, methods=["GET"]),
        Route("/internal/partitions/{partition}/import", import_, methods=["PUT"]),
    ]
