"""`/v1/kv` and `/admin/kv` (API.md, Replicated key-value data): thin routes that hand each
request to the replicators over `relay.replication` and render their answer.

Invariant: nothing here decides anything about the data. The ingress checks only what it can
without the store (names, base64url, sizes, the presence of a bearer token) and sends the
token's SHA-256, never the token; the coordinating replicator authorises, places, runs the
quorum and answers with the API's codes (INDETERMINATE 504 included).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query
from pydantic import Field

from relay_bus import schemas
from relay_ingress import asking
from relay_ingress.checks import B64U_PATTERN, JSON_INTEGER, BoundedJsonRoute, StrictBody
from relay_ingress.deps import Admin, Ctx
from relay_ingress.errors import ApiError, documented
from relay_kv import names, placement

router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/v1/kv",
    tags=["kv"],
    responses=documented(400, 401, 404, 503, 504),
)
admin_router = APIRouter(
    route_class=BoundedJsonRoute,
    prefix="/admin/kv",
    tags=["admin"],
    responses=documented(400, 403, 503),
)

MAX_B64 = 1_400_000
"""Longest base64url value or member sent on (1 MiB decoded; the replicator's own limit,
`RELAY_KV__MAX_VALUE_BYTES`, decides)."""
MAX_TTL_S = 2**32 - 1

Namespace = Annotated[str, Path(pattern=names.NAMESPACE_PATTERN)]
Key = Annotated[str, Path(min_length=1, max_length=names.MAX_KEY_BYTES)]
Quorum = Annotated[int | None, Query(ge=1, le=names.MAX_N)]
B64 = Annotated[str, Field(pattern=B64U_PATTERN, max_length=MAX_B64)]


class NamespaceBody(StrictBody):
    n: Annotated[int, Field(ge=1, le=names.MAX_N), JSON_INTEGER] = 3
    r: Annotated[int, Field(ge=1, le=names.MAX_N), JSON_INTEGER] | None = None
    w: Annotated[int, Field(ge=1, le=names.MAX_N), JSON_INTEGER] | None = None
    gc_grace_s: Annotated[int, Field(ge=0, le=10 * 365 * 86_400), JSON_INTEGER] = 864_000


class ValueBody(StrictBody):
    value: B64
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S), JSON_INTEGER] | None = None


class MembersBody(StrictBody):
    add: list[B64] = Field(default_factory=list, max_length=1000)
    remove: list[B64] = Field(default_factory=list, max_length=1000)
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S), JSON_INTEGER] | None = None


def _token(authorization: str | None) -> str:
    if not authorization or not authorization.startswith("Bearer "):
        raise ApiError(401, "AUTH", "namespace token missing (Authorization: Bearer <token>)")
    return names.token_hash(authorization.removeprefix("Bearer "))


def _body(reply: schemas.KvReply, model: type[schemas.KvAnswer]) -> dict[str, Any]:
    """The replicator's answer read back as `model` (503 for another shape), as the API's
    JSON body."""
    return asking.required(reply, model).model_dump()


async def ask(
    ctx: Ctx,
    op: str,
    model: type[schemas.KvAnswer],
    ns: str,
    key: str,
    authorization: str | None,
    **fields: Any,
) -> dict[str, Any]:
    try:
        names.check_key(key)
    except names.BadName as error:
        raise ApiError(400, "BAD_REQUEST", str(error)) from None
    reply = await asking.replicator(
        ctx,
        placement.shard_of(ns, key),
        op=op,
        ns=ns,
        key=key,
        token_sha256=_token(authorization),
        **fields,
    )
    return _body(reply, model)


Auth = Annotated[str | None, Header()]


@admin_router.put("/namespaces/{ns}")
async def put_namespace(ctx: Ctx, ns: Namespace, body: NamespaceBody, _: Admin) -> dict[str, Any]:
    """Create a namespace (or change its R, W, gc_grace and get a new token; N is fixed)."""
    reply = await asking.replicator(
        ctx,
        placement.shard_of(names.NAMESPACES, ns),
        op="ns_put",
        ns=ns,
        admin=True,
        **body.model_dump(),
    )
    return _body(reply, schemas.KvNamespace)


@router.put("/{ns}/{key}")
async def put_value(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    body: ValueBody,
    authorization: Auth = None,
    w: Quorum = None,
) -> dict[str, Any]:
    return await ask(
        ctx,
        "put",
        schemas.KvVersion,
        ns,
        key,
        authorization,
        value=body.value,
        ttl_s=body.ttl_s,
        w=w,
    )


@router.get("/{ns}/{key}")
async def get_value(
    ctx: Ctx, ns: Namespace, key: Key, authorization: Auth = None, r: Quorum = None
) -> dict[str, Any]:
    return await ask(ctx, "get", schemas.KvRegister, ns, key, authorization, r=r)


@router.delete("/{ns}/{key}")
async def delete_value(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    authorization: Auth = None,
    r: Quorum = None,
    w: Quorum = None,
) -> dict[str, Any]:
    return await ask(ctx, "delete", schemas.KvVersion, ns, key, authorization, r=r, w=w)


@router.post("/{ns}/{key}/members")
async def change_members(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    body: MembersBody,
    authorization: Auth = None,
    r: Quorum = None,
    w: Quorum = None,
) -> dict[str, Any]:
    return await ask(
        ctx,
        "members",
        schemas.KvVersion,
        ns,
        key,
        authorization,
        add=tuple(body.add),
        remove=tuple(body.remove),
        ttl_s=body.ttl_s,
        r=r,
        w=w,
    )


@router.get("/{ns}/{key}/members")
async def list_members(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    authorization: Auth = None,
    r: Quorum = None,
    cursor: Annotated[str | None, Query(pattern=B64U_PATTERN, max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    return await ask(
        ctx,
        "list_members",
        schemas.KvMembers,
        ns,
        key,
        authorization,
        cursor=cursor,
        limit=limit,
        r=r,
    )


@router.put("/{ns}/{key}/fields/{field}")
async def put_field(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    field: Key,
    body: ValueBody,
    authorization: Auth = None,
    r: Quorum = None,
    w: Quorum = None,
) -> dict[str, Any]:
    return await ask(
        ctx,
        "field_put",
        schemas.KvVersion,
        ns,
        key,
        authorization,
        field=field,
        value=body.value,
        ttl_s=body.ttl_s,
        r=r,
        w=w,
    )


@router.get("/{ns}/{key}/fields/{field}")
async def get_field(
    ctx: Ctx, ns: Namespace, key: Key, field: Key, authorization: Auth = None, r: Quorum = None
) -> dict[str, Any]:
    return await ask(ctx, "field_get", schemas.KvRegister, ns, key, authorization, field=field, r=r)


@router.delete("/{ns}/{key}/fields/{field}")
async def delete_field(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    field: Key,
    authorization: Auth = None,
    w: Quorum = None,
) -> dict[str, Any]:
    return await ask(
        ctx, "field_delete", schemas.KvVersion, ns, key, authorization, field=field, w=w
    )


@router.get("/{ns}/{key}/fields")
async def list_fields(
    ctx: Ctx,
    ns: Namespace,
    key: Key,
    authorization: Auth = None,
    r: Quorum = None,
    cursor: Annotated[str | None, Query(pattern=B64U_PATTERN, max_length=2048)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    return await ask(
        ctx,
        "list_fields",
        schemas.KvFields,
        ns,
        key,
        authorization,
        cursor=cursor,
        limit=limit,
        r=r,
    )
