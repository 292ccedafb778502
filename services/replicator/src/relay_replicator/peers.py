"""The other replicators: who they are (site ids learned from their URLs), whether they answer,
the HTTP calls to them, and the membership view with the change under way, if any.

Membership: `RELAY_KV__PEERS` lists replicators' URLs (this one's may be among them). Each URL is
asked for its site id (`GET /internal/kv/site`). A replicator with no `members.json` yet asks
every peer it found for its membership (`GET /internal/kv/members`): if one has a view already,
it takes the newest (it is joining a running cluster: a candidate until a change adds it);
otherwise (a new cluster) the view is every site found, at version 1. A replicator that has a
view asks the peers at start too and takes a newer view or change than its own (one finished
while it was down). It then tells every peer its URL (`POST /internal/kv/announce`), so the
ones whose list lacks it learn it. Everything is kept in `<data dir>/kv/members.json` (the view,
the URL of every site heard of, the change under way with this site's report and the shards it
pulled, and the sites the admin forgot), written atomically, so a restart resumes a change where
it was.

Failure detection is passive: a call that fails (refused, timed out, 5xx) marks the site down for
`down_s`; while down it is not reachable, so quorums plan without it (UNAVAILABLE rather than a
wasted wait, hints for it) and the hint replayer probes it. A call that succeeds marks it up.
A site whose address refuses connections is gone (its process stopped: a slow or cut-off one
would not refuse), and `on_gone` is told, once until it is up again; a first failure of
another kind (a reset, a timeout) is followed by one probe, which tells the two apart.

Invariants: every call has a timeout (`timeout_s`); a peer's error never escapes as anything but
`PeerError`; the readiness condition `members` is true once there is a view and the URL of every
site of it (and of the change under way) is known; the view's version only grows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import structlog

from relay_kv import membership
from relay_kv.membership import Change, Report
from relay_kv.placement import View
from relay_runtime.readiness import Readiness

log = structlog.get_logger(__name__)
_JSON = {"content-type": "application/json"}
_TRANSPORT = (aiohttp.ClientError, TimeoutError)
"""What a call that got no answer raises (refused, reset, timed out)."""
_IDLE_CLOSE_S = 2.0
"""An idle pooled connection is closed after this, well before a peer's server closes it
(`RELAY_HTTP__KEEP_ALIVE_TIMEOUT_S`, 5 s by default): a call never goes out on a connection
the peer is closing at that moment, which would fail it and mark the peer down."""


class PeerError(Exception):
    """A peer did not answer, or answered with an error."""

    def __init__(self, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        """The HTTP status of a refusal (a 4xx: the peer is up and said no), else None."""


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
        """site -> URL, every other replicator heard of (members, candidates)."""
        self.view = View(1, (me,))
        """The view in force: while a change is under way, its old view."""
        self.established = False
        """Whether `view` is the cluster's (found, made or loaded), not this site's guess."""
        self.change: Change | None = None
        self.participants: tuple[str, ...] = ()
        """Every site that must report each step of `change`."""
        self.reports: dict[str, Report] = {}
        """How far each participant is in `change`, as last heard (this site's own is kept)."""
        self.pulled: dict[int, set[int]] = {}
        """n -> the shards this site pulled for `change` (kept, so a restart does not redo
        them)."""
        self.forgotten: set[str] = set()
        """Sites the admin declared dead (`PUT /ds/sites/{site}/forget`): no change waits for
        them, and a change drops them from the view (`relay_replicator.changes`)."""
        self.url: str | None = None
        """This replicator's own URL, once one of the list turned out to be it."""
        self._down_until: dict[str, float] = {}
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None
        """Made on first use, inside the event loop."""
        self._resolver: asyncio.Task[None] | None = None
        self._self_urls: set[str] = set()
        """URLs of the list that turned out to be this replicator."""
        self._announced: set[str] = set()
        self.on_gone: Callable[[str], Awaitable[None]] | None = None
        """Told that a site's process is gone (its address refused a connection), once until
        the site is up again."""
        self._gone: set[str] = set()
        self._checks: set[asyncio.Task[Any]] = set()
        readiness.register("members")

    # -- membership --------------------------------------------------------------------------

    def start(self) -> None:
        if self.members_file.exists():
            self._load(json.loads(self.members_file.read_text()))
        self._update_readiness()
        self._resolver = asyncio.create_task(self._resolve(), name="kv-members")

    def _load(self, known: dict[str, Any]) -> None:
        urls = {str(k): str(v) for k, v in known.get("sites", {}).items()}
        if known.get("v", 1) == 1:  # the static membership's file: every site of the list
            by_url = {url: site for site, url in urls.items()}
            self.sites = {by_url[u]: u for u in self.urls if u in by_url and by_url[u] != self.me}
            self.view = View(1, tuple(sorted({self.me, *self.sites})))
        else:
            self.sites = {s: u for s, u in urls.items() if s != self.me}
            self.view = membership.decode_view(known["view"])
            if known.get("change") is not None:
                self.change = membership.decode_change(known["change"])
                self.participants = tuple(known.get("participants", ()))
                self.reports = {self.me: Report(int(known.get("report", Report.INSTALLED)))}
                self.pulled = {int(n): set(s) for n, s in known.get("pulled", {}).items()}
        self.forgotten = {str(s) for s in known.get("forgotten", ())}
        self.url = known.get("url") or None
        self.established = True

    def save(self) -> None:
        """Write the membership (atomically: a temporary file, fsynced, renamed)."""
        state: dict[str, Any] = {
            "v": 2,
            "view": membership.encode_view(self.view),
            "sites": dict(sorted(self.sites.items())),
            "url": self.url,
            "change": None,
            "forgotten": sorted(self.forgotten),
        }
        if self.change is not None:
            state.update(
                change=membership.encode_change(self.change),
                participants=list(self.participants),
                report=int(self.reports.get(self.me, Report.INSTALLED)),
                pulled={str(n): sorted(s) for n, s in self.pulled.items()},
            )
        temporary = self.members_file.with_suffix(".tmp")
        with temporary.open("w") as out:
            json.dump(state, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.members_file)
        directory = os.open(self.members_file.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    async def stop(self) -> None:
        tasks = [*self._checks, *([self._resolver] if self._resolver is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _http(self, method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
        """(status, body) of one request; `_TRANSPORT` errors when it got no answer.

        aiohttp rather than httpx: a quorum round is one call per replica, and httpx's pure-
        Python stack cost about three times aiohttp's per call here (a loopback round trip of
        1.2 ms against 0.4), time a loaded replicator's event loop spent on its client."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=_IDLE_CLOSE_S),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )
        headers = _JSON if body is not None else None
        async with self._session.request(method, url, data=body, headers=headers) as response:
            return response.status, await response.read()

    @property
    def resolved(self) -> bool:
        """There is a view and every site of it (and of the change) can be reached by URL
        (placement is the same everywhere)."""
        return self.established and all(
            s == self.me or s in self.sites for s in (*self.view.sites, *self.participants)
        )

    @property
    def admitted(self) -> bool:
        """No change is held, or this site takes part in it (every participant counts it, so
        none finishes without it): only then may it coordinate."""
        return self.change is None or self.me in self.participants

    @property
    def site_count(self) -> int:
        """How many sites the smaller of the views has (a system namespace's quorum is a
        majority of it, so that it can be met in both views during a change)."""
        if self.change is None:
            return len(self.view.sites)
        return min(len(self.change.old.sites), len(self.change.new.sites))

    def _unresolved(self) -> list[str]:
        known = set(self.sites.values())
        return [u for u in self.urls if u not in known and u not in self._self_urls]

    async def _resolve(self) -> None:
        caught_up = False
        while True:
            for url in self._unresolved():
                try:
                    status, answer = await self._http("GET", f"{url}/internal/kv/site")
                    if status != 200:
                        continue
                    site = str(json.loads(answer)["site"])
                except (*_TRANSPORT, KeyError, ValueError):
                    continue
                if site == self.me:
                    self._self_urls.add(url)
                    self.url = self.url or url
                else:
                    self.sites[site] = url
                    log.info("kv_peer_found", site=site, url=url)
            if not self.established:
                await self._join_or_found()
                caught_up = True
            elif self.established and not caught_up:
                await self._catch_up()
                caught_up = True
            if self.established:
                await self._announce()
            self._update_readiness()
            if self.established and not self._unresolved() and self._announced >= set(self.sites):
                return
            await asyncio.sleep(0.2 if not self.resolved else 1.0)

    async def _memberships(self) -> dict[str, dict[str, Any]]:
        """Every reachable peer's `GET /internal/kv/members`."""
        found: dict[str, dict[str, Any]] = {}
        for site in list(self.sites):
            with contextlib.suppress(PeerError, KeyError, ValueError):
                found[site] = await self.get(site, "/internal/kv/members")
        return found

    async def _join_or_found(self) -> None:
        """No view yet: take the newest a peer has (joining a running cluster: one peer that
        answers is enough), or found one of every site of the list once every one answered and
        none has a view (a new cluster)."""
        answers = await self._memberships()
        views = [m for m in answers.values() if m.get("established")]
        if views:
            self.adopt(max(views, key=lambda m: int(m["view"]["version"])))
        elif self._unresolved() or len(answers) < len(self.sites):
            return  # a silent peer may have a view: found none until every one answers
        else:
            self.view = View(1, tuple(sorted({self.me, *self.sites})))
        self.established = True
        self.save()
        log.info("kv_view", version=self.view.version, sites=self.view.sites, change=self.change)

    async def _catch_up(self) -> None:
        """A view loaded from disk: take a newer one (or a change) a peer has."""
        views = [m for m in (await self._memberships()).values() if m.get("established")]
        newest = max(views, key=lambda m: int(m["view"]["version"]), default=None)
        if newest is None:
            return
        if int(newest["view"]["version"]) > self.view.version or (
            self.change is None and newest.get("change") is not None
        ):
            self.adopt(newest)
            self.save()
            log.info("kv_view_caught_up", version=self.view.version, change=self.change)

    def adopt(self, other: dict[str, Any]) -> None:
        """Take another site's view and change (its `/internal/kv/members` answer)."""
        for site, url in other.get("sites", {}).items():
            if site != self.me:
                self.sites.setdefault(str(site), str(url))
        self.view = membership.decode_view(other["view"])
        self.forgotten |= {str(s) for s in other.get("forgotten", ()) if s != self.me}
        raw = other.get("change")
        if raw is None:
            self._clear_change()
        else:
            change = membership.decode_change(raw)
            self.install(change.old, change, tuple(other.get("participants", ())), {})

    def install(
        self, old: View, change: Change, participants: tuple[str, ...], urls: dict[str, str]
    ) -> None:
        """Hold `change` (its step starts at PULLING here; reads move when this site moves)."""
        for site, url in urls.items():
            if site != self.me:
                self.sites.setdefault(site, url)
        self.view = old
        self.change = Change(change.old, change.new)
        self.participants = tuple(s for s in participants if s not in self.forgotten)
        self.reports = {self.me: Report.INSTALLED}
        self.pulled = {}

    def finish(self) -> None:
        """The change is over everywhere: its new view is the view."""
        if self.change is not None:
            self.view = self.change.new
        self._clear_change()

    def _clear_change(self) -> None:
        self.change, self.participants, self.reports, self.pulled = None, (), {}, {}

    def forget(self, sites: set[str]) -> bool:
        """Stop waiting for `sites` (dead, declared so by the admin); True if any was new."""
        new = sites - self.forgotten - {self.me}
        if not new:
            return False
        self.forgotten |= new
        self.participants = tuple(s for s in self.participants if s not in new)
        for site in new:
            self.reports.pop(site, None)
        log.warning("kv_sites_forgotten", sites=sorted(new))
        return True

    def withdraw(self, change: Change) -> bool:
        """Drop `change` if it is the one held here and this site did nothing for it yet (its
        start was refused elsewhere); True if it was dropped."""
        held = self.change
        if held is None or held.new != change.new or self.reports[self.me] > Report.INSTALLED:
            return False
        self._clear_change()
        return True

    def report(self, site: str, report: Report) -> None:
        if report > self.reports.get(site, 0):
            self.reports[site] = report

    async def _announce(self) -> None:
        """Tell every peer this site's URL (those whose list lacks it learn it)."""
        if self.url is None:
            return
        for site in list(self.sites):
            if site in self._announced:
                continue
            with contextlib.suppress(PeerError):
                await self.call(site, "/internal/kv/announce", {"site": self.me, "url": self.url})
                self._announced.add(site)

    def heard(self, site: str, url: str) -> None:
        """A replicator announced itself: keep its URL, unless this site reaches it by one of
        its own list already (the configured way wins: a proxy, a service name)."""
        url = url.rstrip("/")
        if site != self.me and site not in self.sites:
            self.sites[site] = url
            log.info("kv_peer_announced", site=site, url=url)
            if self.established:
                self.save()

    def membership(self) -> dict[str, Any]:
        """What `GET /internal/kv/members` answers."""
        return {
            "site": self.me,
            "established": self.established,
            "view": membership.encode_view(self.view),
            "sites": {**self.sites, **({self.me: self.url} if self.url else {})},
            "change": None if self.change is None else membership.encode_change(self.change),
            "participants": list(self.participants),
            "reports": {s: int(r) for s, r in self.reports.items()},
            "forgotten": sorted(self.forgotten),
        }

    def _update_readiness(self) -> None:
        if self.resolved:
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
        self._gone.discard(site)
        if self._down_until.pop(site, None) is not None:
            log.info("kv_peer_up", site=site)

    def _failed(self, site: str, error: BaseException) -> None:
        """A call to `site` got no answer: down; gone if its address refused the connection;
        probed once if this first failure says neither."""
        first = not self.is_down(site)
        self.mark_down(site)
        if self.on_gone is None:
            return
        if isinstance(error, aiohttp.ClientConnectorError) and isinstance(
            error.os_error, ConnectionRefusedError
        ):
            if site not in self._gone:
                self._gone.add(site)
                log.info("kv_peer_gone", site=site)
                self._spawn(self.on_gone(site))
        elif first:
            self._spawn(self.probe(site))

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    # -- calls -------------------------------------------------------------------------------

    async def call(self, site: str, path: str, body: dict[str, Any] | bytes) -> Any:
        """POST `body` (an object, or JSON already encoded) to `site`'s `path`; its JSON
        answer, or `PeerError` (and the site is marked down unless it answered with a 4xx: then
        it is up but refused this)."""
        url = self.sites.get(site)
        if url is None:
            raise PeerError(f"unknown site {site}")
        encoded = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            status, answer = await self._http("POST", f"{url}{path}", encoded)
        except _TRANSPORT as error:
            self._failed(site, error)
            raise PeerError(f"{site}: {type(error).__name__}") from None
        if status >= 500:
            self.mark_down(site)
            raise PeerError(f"{site}: HTTP {status}")
        self.mark_up(site)
        if status >= 400:
            refusal = answer[:200].decode(errors="replace")
            raise PeerError(f"{site}: refused: {refusal}", status)
        return json.loads(answer)

    async def get(self, site: str, path: str) -> Any:
        """GET `site`'s `path`: its JSON answer, or `PeerError` (a failed call marks it down)."""
        url = self.sites.get(site)
        if url is None:
            raise PeerError(f"unknown site {site}")
        try:
            status, answer = await self._http("GET", f"{url}{path}")
        except _TRANSPORT as error:
            self._failed(site, error)
            raise PeerError(f"{site}: {type(error).__name__}") from None
        if status >= 400:
            if status >= 500:
                self.mark_down(site)
            raise PeerError(f"{site}: HTTP {status}")
        self.mark_up(site)
        return json.loads(answer)

    async def probe(self, site: str) -> bool:
        url = self.sites.get(site)
        if url is None:
            return False
        try:
            status, answer = await self._http("GET", f"{url}/internal/kv/site")
            ok = status == 200 and json.loads(answer).get("site") == site
        except _TRANSPORT as error:
            self._failed(site, error)
            return False
        except ValueError:
            ok = False
        if ok:
            self.mark_up(site)
        else:
            self.mark_down(site)
        return ok
