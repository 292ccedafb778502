"""The retainer's replica-set targets, read from their one replicated record per storage
(`relay_ds.targets`, namespace `$ds` on the replicators) and recorded in its stream store.

How a retainer learns a target (decision 0011): at start, then every `poll_s`, it reads the
record of each database it holds with a quorum read (one replicator's `POST
/internal/kv/coordinate`, the first of `RELAY_RETAINED__REPLICATORS` that answers; R = a
majority) and applies any that differs from its own; and when the ingress tells it over Kafka
(`set_replicas` on `relay.publications`, sent once the record is written) it reads the record
at once instead of trusting the request's copy, so requests that arrive out of order cannot
put back an older target. The poll is what repairs a missed request (a retainer that was down,
a request past its deadline) and a volume lost with its `db.json` files.

Invariants:
- a database without a record keeps its own target (it was never written through `/ds` since
  records exist: the migration reads both until written);
- a record is applied whole: its sites are registered (with their nodes) before the target is
  recorded, so a store that lost `sites.json` accepts it;
- reads need no lock (a replicator that hangs does not hold up `/ds` requests); applications
  run one at a time, under the lock the `/ds` requests share (`lock`), so a store's
  `sites.json` and `db.json` have one writer, and never put back a record older than one
  applied before (`relay_ds.targets.not_older`: reads may finish out of order).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import structlog

from relay_ds import targets
from relay_ds.errors import Refused
from relay_durable import codec
from relay_retainer.kv_client import KvClient, KvUnreachable
from relay_retainer.streams import StreamHost
from relay_streams.store import StreamStore

log = structlog.get_logger(__name__)

POLL_S = 10.0
RETRY_S = 1.0
"""Wait between attempts until the first read succeeds (the replicators may start later)."""


class TargetsUnavailable(Exception):
    """No replicator answered the read, or the record is damaged: nothing was applied."""


class TargetSync:
    def __init__(
        self,
        host: StreamHost,
        urls: list[str],
        token: str | None,
        instance: str,
        timeout_s: float,
        poll_s: float = POLL_S,
    ) -> None:
        self.host = host
        self.kv = KvClient(urls, token, instance, timeout_s)
        self.poll_s = poll_s
        self.lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._applied: dict[str, str] = {}
        """The version of the record last applied, per database."""

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Poll in the background (the first read at once); called once the store is open."""
        self._task = asyncio.create_task(self._poll(), name="ds-targets")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.kv.close()

    async def _poll(self) -> None:
        synced = False
        while True:
            try:
                read = await self.read(None)
                async with self.lock:
                    await self.apply(read)
                synced = True
            except Exception as error:  # the next round tries again
                log.warning("ds_targets_unavailable", error=str(error))
            await asyncio.sleep(self.poll_s if synced else RETRY_S)

    # -- reading and applying --------------------------------------------------------------

    async def read(self, names: Iterable[str] | None) -> dict[str, targets.Read]:
        """The records of `names` (every database held when None) that exist, each read with a
        quorum; `TargetsUnavailable` if one could not be read. Needs no lock."""
        held = await asyncio.to_thread(_held, self.host.store, names)
        found: dict[str, targets.Read] = {}
        for name in held:
            record = await self._read(name)
            if record is not None:
                found[name] = record
        return found

    async def apply(self, read: dict[str, targets.Read]) -> set[str]:
        """Record the targets of `read` that differ from the store's and are not older than
        what was applied before; the databases that have a record. The caller holds `lock`."""
        store = self.host.store
        fresh = targets.not_older(read, self._applied)
        local = await asyncio.to_thread(_targets, store, fresh)
        for name, record in targets.changes(local, fresh).items():
            await asyncio.to_thread(_apply, store, name, record)
            log.info("ds_target_applied", db=name, replicas=record.replicas)
        for name in fresh:
            self._applied[name] = read[name].version
        return set(read)

    async def _read(self, name: str) -> targets.Read | None:
        body = await self._coordinate(op="get", key=name)
        if body.get("code") == "NOT_FOUND":
            return None
        if body.get("code") is not None:
            raise TargetsUnavailable(f"{body['code']}: {body.get('detail', '')}")
        try:
            data = body["data"]
            record = targets.decode(codec.unb64u(str(data["value"])))
            return targets.Read(str(data["version"]), record)
        except (KeyError, TypeError, ValueError, Refused) as error:
            raise TargetsUnavailable(f"the target record of {name!r} is damaged: {error}") from None

    async def _coordinate(self, **fields: Any) -> dict[str, Any]:
        try:
            return await self.kv.coordinate(targets.NAMESPACE, **fields)
        except KvUnreachable as error:
            raise TargetsUnavailable(str(error)) from None


def _held(store: StreamStore, names: Iterable[str] | None) -> list[str]:
    held = store.storages()
    return held if names is None else [n for n in names if n in held]


def _targets(store: StreamStore, names: Iterable[str]) -> dict[str, list[Any]]:
    return {name: list(store.replicas(name)) for name in _held(store, names)}


def _apply(store: StreamStore, name: str, record: targets.TargetRecord) -> None:
    for site, node in record.nodes.items():
        if site != store.this_site() and store.registry.sites.get(site) is None:
            store.register_site(site, node)
    store.set_replicas(name, record.replicas)
