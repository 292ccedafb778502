"""The `/ds` admin endpoints (EMQX's durable storage API, admin token): sites, storages and
their replica sets, gathered from every retainer and merged, with each storage's replica-set
target read from its one replicated record (`relay_ds.targets`).

Each retainer instance is one site. A read asks every partition of `relay.publications` for a
description (`describe`); each retainer answers once, with its `relay_ds.info.Description`
(shard ids already global). Each storage's target record is read from the replicators (reserved
namespace `$ds`, R = a majority, over `relay.replication`); a storage without a record keeps its
retainers' own targets (the migration: read both until written). `relay_ds.view.View` merges
them and holds every rule; the handlers here ask, check, send and answer with `relay_ds`'s
values as they are.

Invariants:
- a change is validated against the merged view before anything is sent (unknown sites, a
  replica set too small, a live site to forget: 400; unknown database or site: 404), so a
  refused change changes nothing;
- a replica-set change (set, join, leave) is first written as the storage's record with
  W = a majority of its replicators (a later write wins: the record is a last-writer-wins
  register); only then is every retainer told (`set_replicas` over Kafka, with every known site
  as `peers`), and it is answered 202 "OK" once every partition's owner has applied it. A
  retainer that misses it reads the record at its next start or poll
  (`relay_retainer.ds_targets`);
- a forget of a retainer's site goes to every retainer and is answered 204 once every
  partition's owner applied it; a replicator's site is the replicators' to forget;
- the storage `kv` is the replicators' (`relay_ingress.kv_storage`): its replica set is their
  membership, never a retainer's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Body, Path, Response

from relay_bus import schemas
from relay_ds import sites, targets, tokens
from relay_ds.errors import Refused, Unknown
from relay_ds.info import Description, DsInfo, KvStorage, Site, Storage
from relay_ds.view import View
from relay_durable import codec
from relay_ingress import asking, kv_storage
from relay_ingress.checks import BoundedJsonRoute
from relay_ingress.context import Context
from relay_ingress.deps import Admin, Ctx
from relay_ingress.errors import ApiError, documented
from relay_kv import placement

router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/ds",
    tags=["durable storage admin"],
    responses=documented(403, 503),
)

SitePath = Annotated[str, Path(pattern=sites.SITE_PATTERN, description="site id, 16 hex digits")]
DsPath = Annotated[str, Path(pattern=tokens.NAME_PATTERN, description="durable storage")]
OK = "OK"


@contextmanager
def _refusals() -> Iterator[None]:
    """`relay_ds`'s refusals as the API's errors."""
    try:
        yield
    except Refused as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None
    except Unknown as error:
        raise ApiError(404, "NOT_FOUND", str(error)) from None


async def _stored(ctx: Context, name: str) -> targets.TargetRecord | None:
    """The storage's replicated target record (R = a majority), None if it has none yet."""
    try:
        reply = await asking.replicator(
            ctx,
            placement.shard_of(targets.NAMESPACE, name),
            op="get",
            ns=targets.NAMESPACE,
            key=name,
            admin=True,
        )
    except ApiError as error:
        if error.code == "NOT_FOUND":
            return None
        raise
    found = asking.required(reply, schemas.KvRegister)
    try:
        return targets.decode(codec.unb64u(found.value))
    except (ValueError, Refused) as error:
        detail = f"the target record of {name!r} is damaged: {error}"
        raise ApiError(503, "UNAVAILABLE", detail) from None


async def _view(ctx: Context, only: Iterable[str] | None = None) -> View:
    """Every retainer's description merged with the target records of `only` (the storage
    names given) or of every storage the retainers hold."""
    replies = await asking.every_retainer(ctx, op="describe")
    descriptions = asking.answers(replies, Description)
    names = sorted(
        set(only) if only is not None else {s.name for d in descriptions for s in d.storages}
    )
    records = await asyncio.gather(*(_stored(ctx, name) for name in names))
    stored = {name: r.replicas for name, r in zip(names, records, strict=True) if r is not None}
    return View(descriptions, stored)


async def _write_target(ctx: Context, view: View, ds: str, target: list[sites.SiteId]) -> None:
    """Write the storage's new target (already checked against `view`) to a majority of its
    replicators, then have every retainer apply it."""
    record = targets.record(target, view.known)
    await asking.replicator(
        ctx,
        placement.shard_of(targets.NAMESPACE, ds),
        op="put",
        ns=targets.NAMESPACE,
        key=ds,
        value=codec.b64u(record.encode()),
        admin=True,
    )
    await asking.every_retainer(ctx, op="set_replicas", db=ds, sites=target, peers=view.known)


@router.get("/sites", response_model=list[str])
async def list_sites(ctx: Ctx, _: Admin) -> list[sites.SiteId]:
    """Every known site: each retainer's own and those registered with them."""
    return sorted((await _view(ctx, [])).known)


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
    """Forget a site that is down (EMQX: 204): a retainer's, once it is in no replica set; a
    replicator's is dropped from the replicators' view, and no change waits for it any more
    (`kv_storage.forget`). The replicators are asked first: they answer without the retainers."""
    try:
        replicators: schemas.KvMembership | None = await kv_storage.membership(ctx)
    except ApiError:
        replicators = None  # none answers: the site can only be a retainer's
    if replicators is not None and kv_storage.names(replicators, site):
        await kv_storage.forget(ctx, site)
        return Response(status_code=204)
    view = await _view(ctx)
    with _refusals():
        wanted = view.forgettable(site)
    await asking.every_retainer(ctx, op="forget", site=wanted)
    return Response(status_code=204)


@router.get("/storages", response_model=list[str])
async def list_storages(ctx: Ctx, _: Admin) -> list[str]:
    return (await _view(ctx, [])).storage_names()


@router.get(
    "/storages/{ds}",
    response_model=Storage | KvStorage,
    response_model_exclude_defaults=True,
    responses=documented(400, 404),
)
async def get_storage(ctx: Ctx, _: Admin, ds: DsPath) -> Storage | KvStorage:
    """A storage's shards and replica sets; for `kv` (the replicators) one summary shard."""
    if ds == kv_storage.NAME:
        return await kv_storage.storage(ctx)
    view = await _view(ctx, [ds])
    with _refusals():
        return view.storage(ds)


@router.get("/storages/{ds}/replicas", response_model=list[str], responses=documented(400, 404))
async def get_replicas(ctx: Ctx, _: Admin, ds: DsPath) -> list[sites.SiteId]:
    """The sites the storage's replica set names: its record's (the union over retainers
    while it has none); for `kv`, the replicators' view (the new one during a change)."""
    if ds == kv_storage.NAME:
        return await kv_storage.replicas(ctx)
    view = await _view(ctx, [ds])
    with _refusals():
        return view.replicas(ds)


@router.put(
    "/storages/{ds}/replicas", status_code=202, response_model=str, responses=documented(400, 404)
)
async def set_replicas(ctx: Ctx, _: Admin, ds: DsPath, body: Annotated[list[str], Body()]) -> str:
    """Set the replica set (a list of known sites, not empty, no site twice); for `kv`, start
    a membership change of the replicators."""
    if ds == kv_storage.NAME:
        await kv_storage.set_replicas(ctx, body)
        return OK
    with _refusals():
        wanted = sites.parse_target(body)
    view = await _view(ctx, [ds])
    with _refusals():
        view.check_target(ds, wanted)
    await _write_target(ctx, view, ds, wanted)
    return OK


@router.put(
    "/storages/{ds}/replicas/{site}",
    status_code=202,
    response_model=str,
    responses=documented(400, 404),
)
async def join(ctx: Ctx, _: Admin, ds: DsPath, site: SitePath) -> str:
    """Add a site to the replica set."""
    if ds == kv_storage.NAME:
        await kv_storage.join(ctx, site)
        return OK
    view = await _view(ctx, [ds])
    with _refusals():
        wanted = view.joining(ds, site)
        target = view.target(ds)
    if wanted not in target:
        await _write_target(ctx, view, ds, [*target, wanted])
    return OK


@router.delete(
    "/storages/{ds}/replicas/{site}",
    status_code=202,
    response_model=str,
    responses=documented(400, 404),
)
async def leave(ctx: Ctx, _: Admin, ds: DsPath, site: SitePath) -> str:
    """Remove a site from the replica set (404 if it is not in it)."""
    if ds == kv_storage.NAME:
        await kv_storage.leave(ctx, site)
        return OK
    with _refusals():
        wanted = sites.parse_site(site)
    view = await _view(ctx, [ds])
    with _refusals():
        view.check_leaving(ds, wanted)
        target = [s for s in view.target(ds) if s != wanted]  # not empty: check_leaving
    await _write_target(ctx, view, ds, target)
    return OK


@router.get("/info", response_model=DsInfo, response_model_exclude_defaults=True)
async def info(ctx: Ctx, _: Admin) -> DsInfo:
    """Everything `relayctl ds info` prints (an addition to EMQX's API)."""
    return (await _view(ctx)).info()
