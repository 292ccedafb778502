"""The `/ds` admin endpoints (EMQX's durable storage API, admin token): sites, storages and
their replica sets, gathered from every retainer and merged.

Each retainer instance is one site (its stream store's persistent 16-hex id). A read asks every
partition of `relay.publications` for a description (`describe`); each retainer answers once,
with its site, the sites it has registered, and per database its replica set and its shards
(ids already global, `relay_bus.routing.global_shard`). Merged: a site is `up` when a live
retainer is that site; a database's shards are every retainer's, in id order; its replica set
is the union of the retainers' targets.

Invariants:
- a change is validated against the merged description before anything is sent (unknown
  sites, a replica set too small, a live site to forget: 400; unknown database or site: 404),
  so a refused change changes nothing;
- a change goes to every retainer, with every known site (`peers`) for retainers to register,
  and is answered 202 "OK" (forget: 204) once every partition's owner has applied it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Response
from pydantic import BaseModel

from relay_ingress import asking
from relay_ingress.admin import Admin
from relay_ingress.context import Context, Ctx
from relay_ingress.errors import ApiError, documented
from relay_streams import catalog, sites
from relay_streams.errors import BadInput

router = APIRouter(prefix="/ds", tags=["durable storage admin"], responses=documented(403, 503))

SITE_PATTERN = r"^[0-9A-Fa-f]{16}$"
SitePath = Annotated[str, Path(pattern=SITE_PATTERN, description="site id, 16 hex digits")]
DsPath = Annotated[str, Path(pattern=catalog.NAME_PATTERN, description="durable storage")]
OK = "OK"


class Replica(BaseModel):
    site: str
    status: str
    """`up` (held by a live retainer) or `down`."""


class Transition(BaseModel):
    site: str
    transition: str
    """`joining` or `leaving`: replica-set changes not yet carried out (no data moves until
    the replicator exists)."""


class Shard(BaseModel):
    id: str
    replicas: list[Replica]
    transitions: list[Transition] | None = None


class Storage(BaseModel):
    name: str
    shards: list[Shard]


class SiteShard(BaseModel):
    storage: str
    id: str
    status: str | None = None
    transition: str | None = None


class Site(BaseModel):
    node: str
    up: bool
    shards: list[SiteShard]


class SiteSummary(BaseModel):
    site: str
    node: str
    up: bool


class Retainer(BaseModel):
    instance: str
    site: str
    partitions: list[int]


class DsInfo(BaseModel):
    """What `relayctl ds info` prints: `this_site` is the site of the retainer owning
    partition 0."""

    this_site: str
    sites: list[SiteSummary]
    storages: list[Storage]
    retainers: list[Retainer]


class View:
    """Every retainer's description, merged."""

    def __init__(self, descriptions: list[dict[str, Any]]) -> None:
        self.retainers = sorted(descriptions, key=lambda d: d["partitions"][0])
        self.live = {d["site"]: d for d in self.retainers}
        self.known: dict[str, str] = {}
        for d in self.retainers:
            for entry in d["sites"]:
                self.known.setdefault(entry["site"], entry["node"])
        for site, d in self.live.items():
            self.known[site] = d["node"]

    def storage_names(self) -> list[str]:
        return sorted({s["name"] for d in self.retainers for s in d["storages"]})

    def _parts(self, name: str) -> list[dict[str, Any]]:
        return [s for d in self.retainers for s in d["storages"] if s["name"] == name]

    def storage(self, name: str) -> Storage:
        parts = self._parts(name)
        if not parts:
            raise ApiError(404, "NOT_FOUND", f"unknown storage {name!r}")
        shards = [
            Shard(
                id=shard["id"],
                replicas=[Replica(**r) for r in shard["replicas"]],
                transitions=[Transition(**t) for t in shard["transitions"]] or None,
            )
            for part in parts
            for shard in part["shards"]
        ]
        shards.sort(key=lambda shard: int(shard.id))
        return Storage(name=name, shards=shards)

    def targets(self, name: str) -> list[list[str]]:
        """Each retainer's replica-set target of the storage (404 if no retainer has it)."""
        parts = self._parts(name)
        if not parts:
            raise ApiError(404, "NOT_FOUND", f"unknown storage {name!r}")
        return [list(part["replicas"]) for part in parts]

    def replicas(self, name: str) -> list[str]:
        return sorted({site for target in self.targets(name) for site in target})

    def site(self, site: str) -> Site:
        held: list[SiteShard] = []
        for name in self.storage_names():
            for shard in self.storage(name).shards:
                status = next((r.status for r in shard.replicas if r.site == site), None)
                transition = next(
                    (t.transition for t in shard.transitions or [] if t.site == site), None
                )
                if status is not None or transition is not None:
                    held.append(
                        SiteShard(storage=name, id=shard.id, status=status, transition=transition)
                    )
        return Site(node=self.known[site], up=site in self.live, shards=held)

    def summaries(self) -> list[SiteSummary]:
        return [
            SiteSummary(site=site, node=node, up=site in self.live)
            for site, node in sorted(self.known.items())
        ]


async def _view(ctx: Context) -> View:
    replies = await asking.every_retainer(ctx, op="describe")
    return View([reply.data for reply in replies if reply.data is not None])


def _site(text: str) -> str:
    try:
        return sites.parse_site(text)
    except BadInput as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None


def _known_site(view: View, text: str, status: int = 404) -> str:
    site = _site(text)
    if site not in view.known:
        code = "NOT_FOUND" if status == 404 else "BAD_REQUEST"
        raise ApiError(status, code, f"unknown site {site}")
    return site


@router.get("/sites", response_model=list[str])
async def list_sites(ctx: Ctx, _: Admin) -> list[str]:
    """Every known site: each retainer's own and those registered with them."""
    return sorted((await _view(ctx)).known)


@router.get(
    "/sites/{site}",
    response_model=Site,
    response_model_exclude_none=True,
    responses=documented(400, 404),
)
async def get_site(ctx: Ctx, _: Admin, site: SitePath) -> Site:
    view = await _view(ctx)
    return view.site(_known_site(view, site))


@router.put("/sites/{site}/forget", status_code=204, responses=documented(400, 404))
async def forget_site(ctx: Ctx, _: Admin, site: SitePath) -> Response:
    """Forget a site that is down and in no replica set (EMQX: 204)."""
    view = await _view(ctx)
    wanted = _known_site(view, site)
    if wanted in view.live:
        raise ApiError(
            400,
            "BAD_REQUEST",
            f"site {wanted} is up ({view.live[wanted]['node']}); only a "
            "site that is gone can be forgotten",
        )
    for name in view.storage_names():
        holding = {r.site for shard in view.storage(name).shards for r in shard.replicas}
        if wanted in holding or any(wanted in target for target in view.targets(name)):
            raise ApiError(400, "BAD_REQUEST", f"site {wanted} is in the replica set of {name!r}")
    await asking.every_retainer(ctx, op="forget", site=wanted)
    return Response(status_code=204)


@router.get("/storages", response_model=list[str])
async def list_storages(ctx: Ctx, _: Admin) -> list[str]:
    return (await _view(ctx)).storage_names()


@router.get(
    "/storages/{ds}",
    response_model=Storage,
    response_model_exclude_none=True,
    responses=documented(400, 404),
)
async def get_storage(ctx: Ctx, _: Admin, ds: DsPath) -> Storage:
    return (await _view(ctx)).storage(ds)


@router.get("/storages/{ds}/replicas", response_model=list[str], responses=documented(400, 404))
async def get_replicas(ctx: Ctx, _: Admin, ds: DsPath) -> list[str]:
    """The sites the storage's replica set names (the union over retainers)."""
    return (await _view(ctx)).replicas(ds)


@router.put(
    "/storages/{ds}/replicas", status_code=202, response_model=str, responses=documented(400, 404)
)
async def set_replicas(ctx: Ctx, _: Admin, ds: DsPath, body: Annotated[list[str], Body()]) -> str:
    """Set the replica set (a list of known sites, not empty, no site twice)."""
    wanted = [_site(s) for s in body]
    if not wanted:
        raise ApiError(400, "BAD_REQUEST", "replica set too small: it needs at least one site")
    if len(set(wanted)) != len(wanted):
        raise ApiError(400, "BAD_REQUEST", "a replica set names a site twice")
    view = await _view(ctx)
    view.targets(ds)
    unknown = [s for s in wanted if s not in view.known]
    if unknown:
        raise ApiError(400, "BAD_REQUEST", f"unknown sites: {', '.join(unknown)}")
    await asking.every_retainer(ctx, op="set_replicas", db=ds, sites=wanted, peers=view.known)
    return OK


@router.put(
    "/storages/{ds}/replicas/{site}",
    status_code=202,
    response_model=str,
    responses=documented(400, 404),
)
async def join(ctx: Ctx, _: Admin, ds: DsPath, site: SitePath) -> str:
    """Add a site to the replica set."""
    view = await _view(ctx)
    view.targets(ds)
    wanted = _known_site(view, site, status=400)
    await asking.every_retainer(ctx, op="join", db=ds, site=wanted, peers=view.known)
    return OK


@router.delete(
    "/storages/{ds}/replicas/{site}",
    status_code=202,
    response_model=str,
    responses=documented(400, 404),
)
async def leave(ctx: Ctx, _: Admin, ds: DsPath, site: SitePath) -> str:
    """Remove a site from the replica set (404 if it is not in it)."""
    wanted = _site(site)
    view = await _view(ctx)
    targets = view.targets(ds)
    if not any(wanted in target for target in targets):
        raise ApiError(404, "NOT_FOUND", f"site {wanted} is not part of the replica set")
    if any(target == [wanted] for target in targets):
        raise ApiError(
            400, "BAD_REQUEST", f"replica set too small: {wanted} is the only site of a share"
        )
    await asking.every_retainer(ctx, op="leave", db=ds, site=wanted)
    return OK


@router.get("/info", response_model=DsInfo, response_model_exclude_none=True)
async def info(ctx: Ctx, _: Admin) -> DsInfo:
    """Everything `relayctl ds info` prints (an addition to EMQX's API)."""
    view = await _view(ctx)
    return DsInfo(
        this_site=view.retainers[0]["site"],
        sites=view.summaries(),
        storages=[view.storage(name) for name in view.storage_names()],
        retainers=[
            Retainer(instance=d["node"], site=d["site"], partitions=d["partitions"])
            for d in view.retainers
        ],
    )
