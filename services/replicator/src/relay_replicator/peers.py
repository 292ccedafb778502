"""The other replicators: who they are (site ids learned from their URLs), whether they answer,
and the HTTP calls to them.

Membership: `RELAY_KV__PEERS` lists every replicator's URL (this one's may be among them). Each
URL is asked for its site id (`GET /internal/kv/site`) until all have answered; the sites found
are kept in `<data dir>/kv/members.json`, so a restart is ready at once even while a peer is
down. The view (`relay_kv.placement.View`) is every site, this one included.

Failure detection is passive: a call that fails (refused, timed out, 5xx) marks the site down for
`down_s`; while down it is not reachable, so quorums plan without it (UNAVAILABLE rather than a
wasted wait, hints for it) and the hint replayer probes it. A call that succeeds marks it up.

Invariants: every call has a timeout (`timeout_s`); a peer's error never escapes as anything but
`PeerError`; the readiness condition `members` is true once every peer's site id is known.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import structlog

from relay_kv.placement import View
from relay_runtime.readiness import Readiness

log = structlog.get_logger(__name__)
_JSON = {"content-type": "application/json"}


class PeerError(Exception):
    """A peer did not answer, or answered with an error."""


class Peers:
    def __init__(
        self,
        me: str,
        urls: list[str],
        *,
        token: str | None,
        timeout_s: float,
        down_s: float,
        members_file: Path,
        readiness: Readiness,
    ) -> None:
        self.me = me
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self.down_s = down_s
        self.members_file = members_file
        self.readiness = readiness
        self.sites: dict[str, str] = {}
        """site -> URL, every other replicator."""
        self.view = View(1, (me,))
        self._down_until: dict[str, float] = {}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout_s)
        self._resolver: asyncio.Task[None] | None = None
        self._self_urls: set[str] = set()
        """URLs of the list that turned out to be this replicator."""
        readiness.register("members")

    # -- membership --------------------------------------------------------------------------

    def start(self) -> None:
        if self.members_file.exists():
            known = json.loads(self.members_file.read_text())
            by_url = {url: site for site, url in known.get("sites", {}).items()}
            self.sites = {by_url[u]: u for u in self.urls if u in by_url and by_url[u] != self.me}
        self._update_view()
        self._resolver = asyncio.create_task(self._resolve(), name="kv-members")

    async def stop(self) -> None:
        if self._resolver is not None:
            self._resolver.cancel()
            await asyncio.gather(self._resolver, return_exceptions=True)
        await self.client.aclose()

    @property
    def resolved(self) -> bool:
        """Every peer's site id is known (placement is the same everywhere)."""
        return not self._unresolved()

    def _unresolved(self) -> list[str]:
        known = set(self.sites.values())
        return [u for u in self.urls if u not in known and u not in self._self_urls]

    async def _resolve(self) -> None:
        while True:
            for url in self._unresolved():
                try:
                    response = await self.client.get(f"{url}/internal/kv/site")
                    response.raise_for_status()
                    site = str(response.json()["site"])
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
                if site == self.me:
                    self._self_urls.add(url)
                else:
                    self.sites[site] = url
                    log.info("kv_peer_found", site=site, url=url)
            self._update_view()
            if not self._unresolved():
                self.members_file.write_text(
                    json.dumps({"v": 1, "sites": {**self.sites}}, sort_keys=True)
                )
                self.readiness.set("members", True)
                return
            await asyncio.sleep(0.2)

    def _update_view(self) -> None:
        sites = tuple(sorted({self.me, *self.sites}))
        if sites != self.view.sites:
            self.view = View(self.view.version + 1, sites)
        if not self._unresolved() and self.members_file.exists():
            self.readiness.set("members", True)

    # -- health ------------------------------------------------------------------------------

    def reachable(self) -> set[str]:
        now = time.monotonic()
        return {self.me} | {s for s in self.sites if self._down_until.get(s, 0.0) <= now}

    def is_down(self, site: str) -> bool:
        return site != self.me and self._down_until.get(site, 0.0) > time.monotonic()

    def mark_down(self, site: str) -> None:
        if not self.is_down(site):
            log.info("kv_peer_down", site=site)
        self._down_until[site] = time.monotonic() + self.down_s

    def mark_up(self, site: str) -> None:
        if self._down_until.pop(site, None) is not None:
            log.info("kv_peer_up", site=site)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, site: str, path: str, body: dict[str, Any] | bytes) -> Any:
        """POST `body` (an object, or JSON already encoded) to `site`'s `path`; its JSON
        answer, or `PeerError` (and the site is marked down unless it answered with a 4xx: then
        it is up but refused this)."""
        url = self.sites.get(site)
        if url is None:
            raise PeerError(f"unknown site {site}")
        try:
            if isinstance(body, bytes):
                response = await self.client.post(f"{url}{path}", content=body, headers=_JSON)
            else:
                response = await self.client.post(f"{url}{path}", json=body)
        except httpx.HTTPError as error:
            self.mark_down(site)
            raise PeerError(f"{site}: {type(error).__name__}") from None
        if response.status_code >= 500:
            self.mark_down(site)
            raise PeerError(f"{site}: HTTP {response.status_code}")
        self.mark_up(site)
        if response.status_code >= 400:
            raise PeerError(f"{site}: refused: {response.text[:200]}")
        return response.json()

    async def probe(self, site: str) -> bool:
        url = self.sites.get(site)
        if url is None:
            return False
        try:
            response = await self.client.get(f"{url}/internal/kv/site")
            ok = response.status_code == 200 and response.json().get("site") == site
        except (httpx.HTTPError, ValueError):
            ok = False
        if ok:
            self.mark_up(site)
        else:
            self.mark_down(site)
        return ok
