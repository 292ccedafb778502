"""The storage `kv` of the `/ds` admin API: the replicators' membership (their sites and the
change under way) shown and changed through `GET /ds/storages/kv` and `PUT
/ds/storages/kv/replicas` (API.md), and a dead replicator's site forgotten through `PUT
/ds/sites/{site}/forget`, over `relay.replication` like any key-value request.

The replicators keep the membership (`relay_replicator.changes`): the ingress only asks
whichever replicator coordinates partition 0 (`view`, `view_change`); that one checks the sites
asked for (unknown: 400 `UNKNOWN_SITES`; fewer than a namespace's N: 400
`REPLICA_SET_TOO_SMALL`; another change under way: 409 `CHANGE_IN_PROGRESS`) before anything
changes.

Invariant: a malformed body (not site ids, empty, a site twice) is refused here, 400, and no
request is sent.
"""

from __future__ import annotations

from relay_bus import schemas
from relay_ds import info, sites
from relay_ds.errors import Refused
from relay_ingress import asking
from relay_ingress.context import Context
from relay_ingress.errors import ApiError

NAME = "kv"
"""The storage name of the replicators' data (no retainer storage can use it)."""
ALL_SHARDS = "0-65535"
_NS = "$members"


async def membership(ctx: Context) -> schemas.KvMembership:
    """A replicator's `view` answer (its view, change, reports, who is down)."""
    reply = await asking.replicator(ctx, 0, op="view", ns=_NS, admin=True)
    return asking.required(reply, schemas.KvMembership)


def _target(state: schemas.KvMembership) -> list[sites.SiteId]:
    chosen = state.change.new.sites if state.change else state.view.sites
    return [sites.SiteId(s) for s in chosen]


async def storage(ctx: Context) -> info.KvStorage:
    state = await membership(ctx)
    view = [sites.SiteId(s) for s in state.view.sites]
    down = set(state.down)
    change = state.change
    replicas = [info.Replica(s, info.DOWN if s in down else info.UP) for s in view]
    transitions: list[info.Transition] = []
    shown: info.KvChange | None = None
    if change:
        new = [sites.SiteId(s) for s in change.new.sites]
        transitions = [info.Transition(s, info.JOINING) for s in new if s not in view] + [
            info.Transition(s, info.LEAVING) for s in view if s not in new
        ]
        names = {1: "installed", 2: "pulled", 3: "reading_new", 4: "done"}
        reports = {str(s): names.get(r, str(r)) for s, r in state.reports.items()}
        shown = info.KvChange(change.new.version, new, reports)
    return info.KvStorage(
        NAME,
        [info.Shard(ALL_SHARDS, replicas, transitions)],
        state.view.version,
        view,
        shown,
    )


async def replicas(ctx: Context) -> list[sites.SiteId]:
    """The sites the view will have: the change's new ones while one is under way."""
    return _target(await membership(ctx))


async def set_replicas(ctx: Context, body: list[str]) -> None:
    try:
        wanted = sites.parse_target(body)
    except Refused as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None
    await asking.replicator(ctx, 0, op="view_change", ns=_NS, sites=wanted, admin=True)


async def join(ctx: Context, site: str) -> None:
    wanted = _parse(site)
    target = await replicas(ctx)
    if wanted not in target:
        await set_replicas(ctx, [*target, wanted])


async def leave(ctx: Context, site: str) -> None:
    wanted = _parse(site)
    target = await replicas(ctx)
    if wanted not in target:
        raise ApiError(404, "NOT_FOUND", f"site {wanted} is not a replicator of kv")
    await set_replicas(ctx, [s for s in target if s != wanted])


def names(state: schemas.KvMembership, site: str) -> bool:
    """Whether `site` is a replicator's, as far as the answering replicator knows."""
    change = state.change.new.sites if state.change else []
    return site in {state.site, *state.view.sites, *state.sites, *change, *state.forgotten}


async def forget(ctx: Context, site: str) -> None:
    """Forget a dead replicator site: the replicator checks it (unknown: 404; answering, or
    leaving fewer sites than a namespace's N: 400) before anything changes."""
    await asking.replicator(ctx, 0, op="forget", ns=_NS, sites=[_parse(site)], admin=True)


def _parse(site: str) -> sites.SiteId:
    try:
        return sites.parse_site(site)
    except Refused as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None
