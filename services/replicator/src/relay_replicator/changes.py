"""A membership change of the replicators (a site joining or leaving) carried out while reads and
writes go on: started by the admin (`view` and `view_change` requests, through the ingress's
`/ds/storages/kv`), then driven by every site taking part until each uses the new view.

The rules are `relay_kv.membership`'s; this module sequences them:
- **start** (`begin`, at whichever replicator coordinates the request): every site heard of is
  asked for its membership (`GET /internal/kv/members`); the sites asked for are checked
  (`membership.check_target`, against the largest N of the namespace definitions the sites
  hold); the change (old view -> new view, version + 1) is installed here and offered to every
  participant (the sites of both views and every other replicator that answered: each of them
  coordinates). The start is a compare-and-set: it is accepted only once every participant
  took it; if one holds another change or a newer view (two coordinators started at once), or
  does not answer, it is withdrawn everywhere it was taken (409 or 503), and nothing can have
  moved meanwhile, because no site pulls before every participant holds the change. A
  replicator that gets the change otherwise (started during it) coordinates nothing until
  every participant has heard its report (and so counts it, or has finished);
- **rounds** (every `round_s`, while a change is held): this site tells every participant how far
  it is (`POST /internal/kv/change`, which also installs the change at a site that missed it)
  and learns how far they are from the answers; then, in order:
  1. once every participant holds the change (so every coordinator dual-writes) and a replica
     timeout has passed (a write planned before that is decided), this site pulls the shards it
     enters: per replication factor n, anti-entropy's exchange (`Sync.repair_shards`, pulling
     only) with each of the shard's old home replicas in turn, a shard counting once a read
     quorum of them was merged (`membership.pull_quorum`); pulled shards are kept in
     `members.json`;
  2. once every site of the new view pulled, this site reads the new home replicas;
  3. once every participant reads them, the new view is the view (writes stop going to the old
     home replicas);
- **forget** (`forget`, the admin's `PUT /ds/sites/{site}/forget` for a replicator site that
  does not answer): the site is forgotten here and, through the rounds' bodies, everywhere; no
  step waits for its report any more (it is no participant, and a new view's site that is
  forgotten need not pull). With no change under way, the change that drops it from the view
  starts at once; during one, the change ends first and the lowest live site of the view then
  starts that removal (`membership.removal`, `membership.starter`). A forgotten site never
  takes part again (a change naming it is refused): a replicator comes back as a new site, with
  a new data directory.

Invariants: this site's report only grows and is on disk before anyone hears it; a round that
fails to reach a peer changes nothing but waits for the next; a site that missed a change is
given it by the next round of any participant; a change is refused (409) while another is under
way, and asking again for the change under way is answered as accepted (the ingress resends);
a site that answers is never forgotten, nor one whose loss would leave fewer sites than a
namespace's N.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from prometheus_client import Gauge

from relay_bus import schemas
from relay_durable.outcome import Outcome
from relay_kv import codec, crdt, membership, names
from relay_kv.membership import Report
from relay_replicator.coordinator import NS_N
from relay_replicator.peers import PeerError, Peers
from relay_replicator.periodic import Periodic
from relay_replicator.replica import Refused
from relay_replicator.store import KvStore
from relay_replicator.sync import Sync

log = structlog.get_logger(__name__)

_STEP = Gauge("relay_kv_view_change_report", "This site's report in the change under way (0: none)")
_VIEW = Gauge("relay_kv_view_version", "The version of the membership view in force")

ROUND_S = 0.5
PULL_CHUNK = 1024


class Changes:
    def __init__(
        self, peers: Peers, sync: Sync, store: KvStore, timeout_s: float, round_s: float = ROUND_S
    ) -> None:
        self.peers = peers
        self.sync = sync
        self.store = store
        self.timeout_s = timeout_s
        self._settled_at: float | None = None
        self._removal_refused: str | None = None
        """Why the last removal of forgotten sites was refused (logged once, retried)."""
        self._lock = asyncio.Lock()
        self._rounds = Periodic("kv-change", round_s, self.round)

    def start(self) -> None:
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    # -- what the admin asks (through a coordinator) -----------------------------------------

    async def handle(self, request: schemas.KvRequest) -> Outcome:
        if not request.admin:
            return Outcome.refused(403, "FORBIDDEN", "admin token missing or wrong")
        if request.op == "view":
            state = schemas.KvMembership.model_validate(await self.describe())
            return Outcome(200, state.model_dump())
        if request.op == "forget":
            return await self.forget(request.sites)
        return await self.begin(list(request.sites))

    async def describe(self) -> dict[str, Any]:
        """The view, the change under way and each site's report, with who is down."""
        peers = self.peers
        state = peers.membership()
        state["down"] = sorted(s for s in peers.sites if peers.is_down(s))
        state["max_n"] = self.max_n()
        return state

    def max_n(self) -> int:
        """The largest N among the namespace definitions this site holds (0: none)."""
        largest, after = 0, None
        while True:
            found = self.store.scan(NS_N, names.NAMESPACES, after, 1000)
            for _, _key, raw in found:
                value = codec.decode(raw)
                if isinstance(value, crdt.Register) and value.value is not None:
                    with contextlib.suppress(ValueError, TypeError, names.BadName):
                        largest = max(largest, names.Namespace.decode(value.value).n)
            if len(found) < 1000:
                return largest
            after = (found[-1][0], found[-1][1])

    async def begin(self, sites: list[str]) -> Outcome:
        """Start the change to `sites` (202), or say why not (nothing changed)."""
        async with self._lock:
            try:
                change = await self._start(tuple(sorted(set(sites))))
            except _Answer as answer:
                return answer.outcome
        refusal = await self._offer(change)
        if refusal is None:
            return _changing(change.new.version)
        peers = self.peers
        body = self._body(change, withdraw=True)
        others = [s for s in peers.participants if s != peers.me]
        async with self._lock:
            if peers.withdraw(change):
                peers.save()
        for told in await asyncio.gather(
            *(peers.call(s, "/internal/kv/change", body) for s in others), return_exceptions=True
        ):
            if isinstance(told, Exception):
                log.warning("kv_withdraw_not_heard", error=str(told))
        log.warning("kv_view_change_withdrawn", new=change.new, why=refusal.detail)
        return refusal

    async def _offer(self, change: membership.Change) -> Outcome | None:
        """Offer the change just installed here to every other participant: None once each
        took it, else why not (409: one holds another change or a newer view; 503: one did
        not answer)."""
        peers = self.peers
        body = self._body(change)

        async def offer(site: str) -> str | None:
            try:
                answer = await peers.call(site, "/internal/kv/change", body)
            except PeerError as error:
                return f"{error} ({'conflict' if error.status == 409 else 'no answer'})"
            if int(answer.get("report", 0)) >= Report.DONE:
                return f"{site} has a newer view"
            peers.report(site, Report(int(answer["report"])))
            return None

        others = [s for s in peers.participants if s != peers.me]
        failed = [why for why in await asyncio.gather(*(offer(s) for s in others)) if why]
        if not failed:
            return None
        detail = f"the change was withdrawn, nothing changed: {'; '.join(failed)}"
        if all(why.endswith("(no answer)") for why in failed):
            return Outcome.refused(503, "UNAVAILABLE", detail)
        return Outcome.refused(409, "CHANGE_IN_PROGRESS", detail)

    async def forget(self, sites: tuple[str, ...]) -> Outcome:
        """Forget one dead site (202 with the version the view will have), or say why not
        (nothing changed): it is this one (400), unknown (404), answers (400), or its loss
        would leave fewer sites than a namespace's N (400 `REPLICA_SET_TOO_SMALL`)."""
        peers = self.peers
        if len(sites) != 1:
            return Outcome.refused(400, "BAD_REQUEST", "forget names one site")
        (site,) = sites
        if site == peers.me:
            return Outcome.refused(400, "BAD_REQUEST", f"site {site} is this replicator's own")
        change = peers.change
        named = {*peers.view.sites, *peers.sites, *(change.new.sites if change else ())}
        if site not in named and site not in peers.forgotten:
            return Outcome.refused(404, "NOT_FOUND", f"unknown site {site}")
        with contextlib.suppress(PeerError, ValueError, KeyError):
            await peers.get(site, "/internal/kv/members")
            detail = f"site {site} answers; only a site that is gone can be forgotten"
            return Outcome.refused(400, "BAD_REQUEST", detail)
        async with self._lock:
            kept = [s for s in (change.new.sites if change else peers.view.sites) if s != site]
            needed = max(self.max_n(), 1)
            if len(kept) < needed:
                detail = f"{len(kept)} sites would be left, but a namespace has n={needed}"
                return Outcome.refused(400, "REPLICA_SET_TOO_SMALL", detail)
            if peers.forget({site}):
                peers.save()
        if peers.change is None:
            await self._remove_forgotten()
        version = peers.change.new.version if peers.change else peers.view.version
        return _changing(version)

    async def _remove_forgotten(self) -> None:
        """With no change under way, start the one that drops the forgotten sites of the view,
        at its one starter (any site, for the admin's own request)."""
        peers = self.peers
        target = membership.removal(peers.view, peers.forgotten)
        if peers.change is not None or target is None:
            return
        outcome = await self.begin(list(target))
        if outcome.status != 202 and outcome.detail != self._removal_refused:
            log.warning("kv_removal_refused", sites=target, detail=outcome.detail)
        self._removal_refused = None if outcome.status == 202 else outcome.detail

    async def _start(self, wanted: tuple[str, ...]) -> membership.Change:
        peers = self.peers
        if peers.change is not None:
            if wanted == peers.change.new.sites:
                raise _Answer(_changing(peers.change.new.version))
            raise _conflict(f"a change to {peers.change.new.sites} is under way")
        answers: dict[str, dict[str, Any]] = {peers.me: await self.describe()}
        back = sorted(set(wanted) & peers.forgotten)
        if back:
            detail = f"sites {back} were forgotten: a replicator comes back as a new site"
            raise _Answer(Outcome.refused(400, "BAD_REQUEST", detail))
        for site in sorted(set(peers.sites) - peers.forgotten):
            with contextlib.suppress(PeerError, ValueError):
                answers[site] = await peers.get(site, "/internal/kv/members")
        for answer in answers.values():
            if answer.get("change") is not None:
                raise _conflict(f"site {answer['site']} holds a change")
            if int(answer["view"]["version"]) > peers.view.version:
                raise _conflict("a newer view exists; try again")
        try:
            target = membership.check_target(
                peers.view,
                wanted,
                {peers.me, *peers.sites},
                max((int(a.get("max_n", 0)) for a in answers.values()), default=0),
            )
        except membership.UnknownSites as error:
            raise _Answer(Outcome.refused(400, "UNKNOWN_SITES", str(error))) from None
        except membership.TooFewSites as error:
            raise _Answer(Outcome.refused(400, "REPLICA_SET_TOO_SMALL", str(error))) from None
        if target == peers.view.sites:
            raise _Answer(_changing(peers.view.version))
        silent = sorted(
            s for s in {*peers.view.sites, *target} if s not in answers and s not in peers.forgotten
        )
        if silent:
            detail = f"sites {silent} do not answer; nothing changed"
            raise _Answer(Outcome.refused(503, "UNAVAILABLE", detail))
        change = membership.Change.start(peers.view, target, peers.view.version + 1)
        participants = tuple(sorted({*peers.view.sites, *target, *answers}))
        peers.install(peers.view, change, participants, {})
        peers.save()
        log.info("kv_view_change_started", old=change.old, new=change.new)
        return change

    # -- what a peer tells -----------------------------------------------------------------

    async def receive(self, body: dict[str, Any]) -> dict[str, Any]:
        """A participant's report (and the change, for a site that does not hold it yet);
        answers this site's report."""
        peers = self.peers
        change = membership.decode_change(body["change"])
        sender = str(body["site"])
        urls = {str(s): str(u) for s, u in body.get("sites", {}).items()}
        async with self._lock:
            if not peers.established:
                raise Refused("this replicator has no view yet")
            if body.get("withdraw"):
                if peers.withdraw(change):
                    peers.save()
                    log.info("kv_view_change_withdrawn", new=change.new, by=sender)
                return {"report": 0}
            if sender in peers.forgotten:
                raise Refused(f"site {sender} was forgotten")
            if peers.forget({str(s) for s in body.get("forgotten", ())}):
                peers.save()
            if change.new.version <= peers.view.version:
                return {"report": int(Report.DONE)}
            if peers.change is None:
                peers.install(change.old, change, tuple(body.get("participants", ())), urls)
                peers.save()
                log.info("kv_view_change_installed", old=change.old, new=change.new)
            elif peers.change.new != change.new:
                raise Refused(f"another change is under way here: {peers.change.new}")
            if sender not in peers.participants and peers.reports[peers.me] < Report.DONE:
                peers.participants = tuple(sorted({*peers.participants, sender}))
                peers.save()
            for site, url in urls.items():
                if site != peers.me:
                    peers.sites.setdefault(site, url)
            peers.report(sender, Report(int(body["report"])))
            return {"report": int(peers.reports[peers.me])}

    # -- one round -------------------------------------------------------------------------

    async def round(self) -> None:
        peers = self.peers
        _VIEW.set(peers.view.version)
        change = peers.change
        if not peers.established:
            return
        if change is None:
            _STEP.set(0)
            if membership.starter(peers.view, peers.forgotten) == peers.me:
                await self._remove_forgotten()
            return
        await self._tell_everyone(change)
        if peers.change is not change:  # taken from a peer meanwhile (at start): next round
            return
        mine = peers.reports[peers.me]
        if mine == Report.INSTALLED and membership.may_pull(peers.reports, peers.participants):
            now = time.monotonic()
            if self._settled_at is None:
                self._settled_at = now + self.timeout_s
            if now >= self._settled_at and await self.pull(change):
                if peers.change is not change:
                    return
                self._advance(Report.PULLED)
        if peers.reports[peers.me] == Report.PULLED and membership.may_read_new(
            change, peers.reports, peers.forgotten
        ):
            async with self._lock:
                peers.change = change.reading_new()
                self._advance(Report.READING_NEW)
        if peers.reports[peers.me] == Report.READING_NEW and membership.all_read_new(
            peers.reports, peers.participants
        ):
            async with self._lock:
                peers.finish()
                peers.save()
            self._settled_at = None
            log.info("kv_view_change_finished", view=peers.view)
            _STEP.set(0)
            _VIEW.set(peers.view.version)
            return
        _STEP.set(int(peers.reports[peers.me]))

    def _advance(self, report: Report) -> None:
        self.peers.reports[self.peers.me] = report
        self.peers.save()
        log.info("kv_view_change_step", report=report.name, change=self.peers.change)

    def _body(self, change: membership.Change, withdraw: bool = False) -> dict[str, Any]:
        """What this site tells a participant about `change`: its report, the participants,
        the URLs and forgotten sites it knows (or that the change is withdrawn)."""
        peers = self.peers
        return {
            "site": peers.me,
            "change": membership.encode_change(change),
            "participants": list(peers.participants),
            "sites": {**peers.sites, **({peers.me: peers.url} if peers.url else {})},
            "forgotten": sorted(peers.forgotten),
            "report": int(peers.reports.get(peers.me, Report.INSTALLED)),
            **({"withdraw": True} if withdraw else {}),
        }

    async def _tell_everyone(self, change: membership.Change) -> None:
        peers = self.peers
        body = self._body(change)

        async def tell(site: str) -> bool:
            try:
                answer = await peers.call(site, "/internal/kv/change", body)
                peers.report(site, Report(int(answer["report"])))
            except (PeerError, KeyError, ValueError):
                return False
            return True

        others = [s for s in peers.participants if s != peers.me]
        told = await asyncio.gather(*(tell(site) for site in others))
        if peers.me not in peers.participants and all(told):
            # Every participant now counts this site (or finished): it may coordinate.
            peers.participants = tuple(sorted({*peers.participants, peers.me}))
            peers.save()
            log.info("kv_view_change_admitted", change=change)
        if any(peers.reports.get(s) == Report.DONE for s in others):
            # Someone finished: every participant read the new set, this one included.
            peers.report(peers.me, Report.READING_NEW)

    # -- the pull --------------------------------------------------------------------------

    async def pull(self, change: membership.Change) -> bool:
        """Merge every shard this site enters from a read quorum of its old home replicas;
        True once all are (those pulled are kept across restarts)."""
        peers = self.peers
        me = peers.me
        old_sites = [s for s in change.old.sites if s != me]
        held: dict[str, dict[int, set[int]]] = {}
        # A forgotten site is not asked: it counts as a missing old replica below.
        for site in (s for s in old_sites if s not in peers.forgotten):
            with contextlib.suppress(PeerError, KeyError, ValueError):
                answer = await peers.call(site, "/internal/kv/tree/held", {})
                held[site] = {int(n): set(s) for n, s in answer["classes"].items()}
        classes = sorted({n for h in held.values() for n in h} | {NS_N})
        done = True
        for n in classes:
            home = min(n, len(change.old.sites))
            missing = [s for s in old_sites if s not in held]
            if len(missing) > home - membership.pull_quorum(home):
                log.info("kv_pull_waiting", n=n, missing=missing)
                done = False
                continue
            with_data = sorted({s for h in held.values() for s in h.get(n, ())})
            pulled = self.peers.pulled.setdefault(n, set())
            wanted = [s for s in change.incoming(me, n, with_data) if s not in pulled]
            for start in range(0, len(wanted), PULL_CHUNK):
                chunk = wanted[start : start + PULL_CHUNK]
                merged = await self._pull_chunk(
                    change, n, chunk, [s for s in old_sites if s in held]
                )
                got = [
                    s
                    for s in chunk
                    if merged[s] >= membership.pull_quorum(len(change.old.replicas(s, n).home))
                ]
                pulled.update(got)
                done = done and len(got) == len(chunk)
                peers.save()
        if done:
            log.info("kv_pull_done", shards={n: len(s) for n, s in peers.pulled.items()})
        return done

    async def _pull_chunk(
        self, change: membership.Change, n: int, chunk: list[int], sources: list[str]
    ) -> dict[int, int]:
        """Pull `chunk` from each of `sources` that is an old home replica of some of it, one
        after the other (the second finds equal hashes for what the first brought: pulling all
        at once was measured to merge every key from each, for a few seconds less); per shard,
        how many of them were merged."""
        merged = dict.fromkeys(chunk, 0)
        for site in sources:
            theirs = [s for s in chunk if site in change.old.replicas(s, n).home]
            if not theirs:
                continue
            try:
                await self.sync.repair_shards(site, n, theirs, push=False)
            except (PeerError, Refused, TimeoutError) as error:
                log.info("kv_pull_interrupted", site=site, n=n, error=str(error))
                continue
            for shard in theirs:
                merged[shard] += 1
        return merged


class _Answer(Exception):
    """How `begin` ends early: the outcome to answer."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.detail)
        self.outcome = outcome


def _changing(version: int) -> Outcome:
    """The 202 of a `view_change`: the version the view will have (or has)."""
    return Outcome(202, schemas.KvViewChanging(version=version).model_dump())


def _conflict(detail: str) -> _Answer:
    return _Answer(Outcome.refused(409, "CHANGE_IN_PROGRESS", detail))
