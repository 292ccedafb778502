"""The `/ds` admin endpoints (EMQX's durable storage API, admin token): sites, storages and
their replica sets, gathered from every retainer and merged.

Each retainer instance is one site. A read asks every partition of `relay.publications` for a
description (`describe`); each retainer answers once, with its `relay_ds.info.Description`
(shard ids already global). `relay_ds.view.View` merges them and holds every rule; the
handlers here ask, check, send and answer with `relay_ds`'s values as they are.

Invariants:
- a change is validated against the merged view before anything is sent (unknown sites, a
  replica set too small, a live site to forget: 400; unknown database or site: 404), so a
  refused change changes nothing;
- a change goes to every retainer, with every known site (`peers`) for retainers to register,
  and is answered 202 "OK" (forget: 204) once every partition's owner has applied it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Body, Path, Response
from pydantic import TypeAdapter

from relay_ds import sites, tokens
from relay_ds.errors import Refused, Unknown
from relay_ds.info import Description, DsInfo, Site, Storage
from relay_ds.view import View
from relay_ingress import asking
from relay_ingress.admin import Admin
from relay_ingress.context import Context, Ctx
from relay_ingress.errors import ApiError, documented

router = APIRouter(prefix="/ds", tags=["durable storage admin"], responses=documented(403, 503))

SitePath = Annotated[str, Path(pattern=sites.SITE_PATTERN, description="site id, 16 hex digits")]
DsPath = Annotated[str, Path(pattern=tokens.NAME_PATTERN, description="durable storage")]
OK = "OK"
_DESCRIPTION = TypeAdapter(Description)


@contextmanager
def _refusals() -> Iterator[None]:
    """`relay_ds`'s refusals as the API's errors."""
    try:
        yield
    except Refused as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None
    except Unknown as error:
        raise ApiError(404, "NOT_FOUND", str(error)) from None


async def _view(ctx: Context) -> View:
    replies = await asking.every_retainer(ctx, op="describe")
    return View(_DESCRIPTION.validate_python(r.data) for r in replies if r.data is not None)


@router.get("/sites", response_model=list[str])
async def list_sites(ctx: Ctx, _: Admin) -> list[sites.SiteId]:
    """Every known site: each retainer's own and those registered with them."""
    return sorted((await _view(ctx)).known)


@router.get(
    "/sites/{site}",
    response_model=Site,
    response_model_exclude_defaults=True,
    responses=documented(400, 404),
)
async def get_site(ctx: Ctx, _: Admin, site: SitePath) -> Site:
    view = await _view(ctx)
    with _refusals():
        return view.site(view.known_site(site))


@router.put("/sites/{site}/forget", status_code=204, responses=documented(400, 404))
async def forget_site(ctx: Ctx, _: Admin, site: SitePath) -> Response:
    """Forget a site that is down and in no replica set (EMQX: 204)."""
    view = await _view(ctx)
    with _refusals():
        wanted = view.forgettable(site)
    await asking.every_retainer(ctx, op="forget", site=wanted)
    return Response(status_code=204)


@router.get("/storages", response_model=list[str])
async def list_storages(ctx: Ctx, _: Admin) -> list[str]:
    return (await _view(ctx)).storage_names()


@router.get(
    "/storages/{ds}",
    response_model=Storage,
    response_model_exclude_defaults=True,
    responses=documented(400, 404),
)
async def get_storage(ctx: Ctx, _: Admin, ds: DsPath) -> Storage:
    view = await _view(ctx)
    with _refusals():
        return view.storage(ds)


@router.get("/storages/{ds}/replicas", response_model=list[str], responses=documented(400, 404))
async def get_replicas(ctx: Ctx, _: Admin, ds: DsPath) -> list[sites.SiteId]:
    """The sites the storage's replica set names (the union over retainers)."""
    view = await _view(ctx)
    with _refusals():
        return view.replicas(ds)


@router.put(
    "/storages/{ds}/replicas", status_code=202, response_model=str, responses=documented(400, 404)
)
async def set_replicas(ctx: Ctx, _: Admin, ds: DsPath, body: Annotated[list[str], Body()]) -> str:
    """Set the replica set (a list of known sites, not empty, no site twice)."""
    with _refusals():
        wanted = sites.parse_target(body)
    view = await _view(ctx)
    with _refusals():
        view.check_target(ds, wanted)
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
    with _refusals():
        wanted = view.joining(ds, site)
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
    with _refusals():
        wanted = sites.parse_site(site)
    view = await _view(ctx)
    with _refusals():
        view.check_leaving(ds, wanted)
    await asking.every_retainer(ctx, op="leave", db=ds, site=wanted)
    return OK


@router.get("/info", response_model=DsInfo, response_model_exclude_defaults=True)
async def info(ctx: Ctx, _: Admin) -> DsInfo:
    """Everything `relayctl ds info` prints (an addition to EMQX's API)."""
    return (await _view(ctx)).info()
