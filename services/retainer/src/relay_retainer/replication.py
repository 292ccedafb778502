"""Retained messages kept on the replicators too (`RELAY_RETAINED__REPLICATION=quorum`), so that a
retainer whose volume is lost rebuilds its retained store from them.

Each retained publish or delete, once durable here, is written to the reserved namespace
`$retained` of the replicated key-value store (key = topic, value = `{"payload", "ts",
"expiry_s"}`, a delete = a tombstone) through one replicator's `POST /internal/kv/coordinate`
(the first of `RELAY_RETAINED__REPLICATORS` that answers); the publish is answered only once a
quorum of replicas has it. A retainer that opens an empty store asks every replicator for its
`$retained` keys, merges the copies (CRDT merge: the newest write wins) and stores the live
messages of the partitions it owns before it serves.

Invariants:
- writes of one topic reach the replicators in the order they were made durable here (a chain
  per topic), so the replicated value is the last one retained;
- a publish is answered 2xx only if both the local write and the quorum write succeeded; a
  failed quorum write is 503 (retrying the publish is safe: it is idempotent);
- the rebuild writes nothing when the store is not empty.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from relay_bus import schemas
from relay_durable import codec
from relay_kv import codec as kv_codec
from relay_kv import crdt
from relay_retainer.kv_client import KvClient, KvUnreachable

log = structlog.get_logger(__name__)

NAMESPACE = "$retained"
N = 3


class ReplicationFailed(Exception):
    pass


class RetainedReplication:
    def __init__(self, urls: list[str], token: str | None, instance: str, timeout_s: float) -> None:
        self.kv = KvClient(urls, token, instance, timeout_s)
        self.urls = self.kv.urls
        self.http = self.kv.http
        self._chains: dict[str, asyncio.Future[None]] = {}

    async def close(self) -> None:
        await self.kv.close()

    async def replicate(self, topic: str, payload: bytes, ts: int, expiry_s: int | None) -> None:
        """Write (or, with an empty payload, delete) `topic`'s message on a quorum, after every
        earlier write of the same topic."""
        previous = self._chains.get(topic)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._chains[topic] = done
        try:
            if previous is not None:
                await asyncio.shield(previous)
            if payload:
                value = json.dumps({"payload": codec.b64u(payload), "ts": ts, "expiry_s": expiry_s})
                await self._coordinate(
                    op="put", key=topic, value=codec.b64u(value.encode()), ttl_s=expiry_s
                )
            else:
                await self._coordinate(op="delete", key=topic)
        finally:
            done.set_result(None)
            if self._chains.get(topic) is done:
                del self._chains[topic]

    async def _coordinate(self, **fields: Any) -> dict[str, Any]:
        try:
            body = await self.kv.coordinate(NAMESPACE, **fields)
        except KvUnreachable as error:
            raise ReplicationFailed(str(error)) from None
        if body.get("code") is not None:
            raise ReplicationFailed(f"{body['code']}: {body.get('detail', '')}")
        return body

    async def scan_all(
        self, wanted: Callable[[str], bool]
    ) -> list[tuple[str, bytes, int, int | None]]:
        """Every live replicated message whose topic is `wanted`: (topic, payload, ts,
        expiry_s), the copies of every replicator merged."""
        merged: dict[str, crdt.Value] = {}
        for url in self.urls:
            after: list[Any] | None = None
            while True:
                try:
                    response = await self.http.post(
                        f"{url}/internal/kv/scan",
                        json={"n": N, "ns": NAMESPACE, "after": after, "limit": 1000},
                    )
                    response.raise_for_status()
                except httpx.HTTPError as error:
                    log.warning("retained_rebuild_replicator_skipped", url=url, error=str(error))
                    break
                keys = response.json()["keys"]
                for item in keys:
                    value = kv_codec.from_json(item["value"])
                    old = merged.get(item["key"])
                    merged[item["key"]] = value if old is None else crdt.merge(old, value)
                if len(keys) < 1000:
                    break
                after = [keys[-1]["shard"], keys[-1]["key"]]
        found = []
        now = int(schemas.now_ms_())
        for topic, value in sorted(merged.items()):
            if not isinstance(value, crdt.Register) or not wanted(topic):
                continue
            raw = value.visible(now)
            if raw is None:
                continue
            message = json.loads(raw)
            found.append(
                (topic, codec.unb64u(message["payload"]), int(message["ts"]), message["expiry_s"])
            )
        return found
