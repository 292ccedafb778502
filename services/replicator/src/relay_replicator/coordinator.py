"""The coordinator: runs each `kv_request` read from `relay.replication` against the key's
replicas and answers the asking ingress with a `kv_reply`.

Any replicator coordinates the requests of the partitions it consumes (consumer group
`relay.replicator`); replicas are reached directly (this process) or over HTTP
(`relay_replicator.peers`). The rules are `relay_kv`'s; this module only sequences them.

- Writes: the value is stamped with this site's hybrid logical clock and sent to every reachable
  home replica; OK after W fsynced acknowledgements, INDETERMINATE when W can no longer be
  reached or the time is up, UNAVAILABLE (nothing sent) when fewer than W are reachable. An
  unreachable or failing home replica gets a hint on the first reachable fallback. A replica that
  holds a newer last-writer-wins version says so; the coordinator moves its clock past it and
  writes again, so a write that starts after another was acknowledged wins (even from a site
  whose clock is behind).
- Reads: from every reachable home replica, answered after R, merged; stale replicas among the
  R are repaired before the answer (blocking read repair), late answers in the background.
- During a membership change (`Peers.change`, driven by `relay_replicator.changes`), writes and
  reads are planned by `relay_kv.membership`: writes to the home replicas of both views, OK once
  W of each acknowledged; reads from the old home replicas until this site moved to the new
  (and what such a read answers is written to the shard's new home replicas before the answer,
  so a later read of the new set cannot go back from it).
  The admin's `view` and `view_change` requests go to `view_ops` (`Changes.handle`).
- Sets (and whole-key deletes of sets and maps) are read-modify-write: the add's dot and the
  remove's observed dots come from a quorum read. Such operations on one key are serialised in
  this process (a lock per key): two concurrent adds stamped by one site must not both build on
  the same read, or the later one's clock would cover the earlier one's dot. A set is a head
  and a row per member (`relay_kv.setrows`): an operation reads and writes the head and the
  rows of the members it names in one round (one batch per replica), a listing merges pages of
  rows from R replicas, a whole-set delete removes the observed members a page at a time.

Invariants: each request id runs once (`OncePerId`) and every copy is answered; a request past
its deadline is dropped unanswered (its asker has already answered 503); every failure ends in
an API error code, never silence: BAD_REQUEST, AUTH, NOT_FOUND, UNAVAILABLE, INDETERMINATE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from prometheus_client import Counter, Gauge, Histogram

from relay_bus import schemas, topics
from relay_bus.bus import Bus, BusUnavailableError
from relay_bus.consumers import Received
from relay_bus.once import OncePerId
from relay_durable import codec as b64
from relay_durable.outcome import Outcome
from relay_kv import codec as kv_codec
from relay_kv import crdt, membership, names, ops, placement, quorum, setrows
from relay_kv.clock import HybridClock, Version
from relay_replicator.peer_calls import PeerCalls
from relay_replicator.peers import PeerError, Peers
from relay_replicator.replica import LocalReplica, Refused

log = structlog.get_logger(__name__)
T = TypeVar("T")

_LATENCY = Histogram(
    "relay_kv_quorum_seconds",
    "Coordinated operations, from the request read to the outcome",
    ["op", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
_REPAIRS = Counter("relay_kv_read_repairs_total", "Stale replicas written by read repair", ["when"])
_HINTS_SENT = Counter("relay_kv_hints_sent_total", "Hints stored on a fallback for a home replica")
_RESENDS = Counter("relay_kv_newer_resends_total", "Writes stamped again past a newer version")
_HINTS_HELD = Gauge("relay_kv_hints_held_bytes", "Bytes of hints this site holds for others")

NS_N = names.MAX_N
"""Replication factor of the reserved namespace of namespace definitions: every site (up to
seven) keeps every definition, so each can read a namespace's `gc_grace` locally."""
NS_CACHE_S = 2.0
MAX_RESENDS = 3
SET_PAGE = 500
"""Member rows a whole-set delete removes per write round."""
ADMISSION_WAITS = 40
"""How many 50 ms waits a request gets for this site to be admitted to a change it holds
(`Peers.admitted`: a round or two of reports) before it is refused."""


class Refusal(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = Outcome.refused(status, code, detail)


def _bad(detail: str) -> Refusal:
    return Refusal(400, "BAD_REQUEST", detail)


@dataclass(frozen=True)
class CoordinatorSettings:
    timeout_s: float
    """Longest a quorum round waits for replicas."""
    max_value_bytes: int


class Replicas:
    """Reaching a replica: this process directly, another over HTTP (batched per peer:
    `relay_replicator.peer_calls`; hints go alone)."""

    def __init__(self, local: LocalReplica, peers: Peers, timeout_s: float) -> None:
        self.local = local
        self.peers = peers
        self.peer_writes = PeerCalls(peers, "/internal/kv/write", "results", timeout_s)
        self.peer_reads = PeerCalls(peers, "/internal/kv/read", "values", timeout_s)

    async def write(
        self, site: str, items: list[tuple[int, str, str, crdt.Value]], hint_for: str | None = None
    ) -> list[dict[str, Any]]:
        if site == self.local.site:
            return await self.local.write(items, hint_for)
        encoded = [
            json.dumps(
                {"n": n, "ns": ns, "key": key, "value": kv_codec.to_json(value)},
                separators=(",", ":"),
            )
            for n, ns, key, value in items
        ]
        if hint_for is None:
            results: list[dict[str, Any]] = await self.peer_writes.ask(site, encoded)
            return results
        body = '{"items":[' + ",".join(encoded) + '],"hint_for":' + json.dumps(hint_for) + "}"
        answer = await self.peers.call(site, "/internal/kv/write", body.encode())
        hinted: list[dict[str, Any]] = answer["results"]
        return hinted

    async def read(self, site: str, items: list[tuple[int, str, str]]) -> list[crdt.Value | None]:
        if site == self.local.site:
            return self.local.read(items)
        encoded = [
            json.dumps({"n": n, "ns": ns, "key": key}, separators=(",", ":"))
            for n, ns, key in items
        ]
        values = await self.peer_reads.ask(site, encoded)
        return [None if v is None else kv_codec.from_json(v) for v in values]

    async def rows(
        self, site: str, target: _Target, after: str | None, limit: int
    ) -> tuple[list[tuple[str, crdt.Value]], bool]:
        """A page of a set's member rows on `site` (tombstones included), and whether more
        follow."""
        if site == self.local.site:
            return self.local.rows(target.n, target.namespace, target.key, after, limit)
        body = {"n": target.n, "ns": target.namespace, "key": target.key, "limit": limit}
        answer = await self.peers.call(site, "/internal/kv/rows", {**body, "after": after})
        found = [(str(row), kv_codec.from_json(value)) for row, value in answer["rows"]]
        return found, bool(answer["more"])

    async def close(self) -> None:
        await self.peer_writes.close()
        await self.peer_reads.close()


class Coordinator:
    def __init__(
        self,
        bus: Bus,
        instance: str,
        replicas: Replicas,
        clock: HybridClock,
        settings: CoordinatorSettings,
        now_ms: Callable[[], int],
    ) -> None:
        self.bus = bus
        self.instance = instance
        self.replicas = replicas
        self.peers = replicas.peers
        self.clock = clock
        self.settings = settings
        self.now_ms = now_ms
        self.once: OncePerId[Outcome] = OncePerId(10_000, "kv_request")
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._namespaces: dict[str, tuple[names.Namespace, float]] = {}
        self._lookups: dict[str, asyncio.Future[names.Namespace]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.view_ops: Callable[[schemas.KvRequest], Awaitable[Outcome]] | None = None
        """Runs the admin's `view`, `view_change` and `forget` requests
        (`relay_replicator.changes`)."""

    # -- the consumer's side ---------------------------------------------------------------

    async def handle(self, received: Received) -> None:
        request = received.record
        if not isinstance(request, schemas.KvRequest):
            return
        if request.expired():
            log.debug("kv_request_expired", id=request.id)
            return
        self.once.handle(request.id, lambda: self.run(request), lambda o: self._reply(request, o))

    async def _reply(self, request: schemas.KvRequest, outcome: Outcome) -> None:
        reply = schemas.KvReply(
            id=request.id,
            origin=request.origin,
            instance=self.instance,
            status=outcome.status,
            data=outcome.data,
            code=outcome.code,
            detail=outcome.detail,
        )
        try:
            await self.bus.send(topics.INGRESS_INBOX, reply, partition=request.reply_slot)
        except BusUnavailableError:
            log.warning("kv_reply_dropped", id=request.id)

    async def run(self, request: schemas.KvRequest) -> Outcome:
        started = time.perf_counter()
        try:
            outcome = await self._run(request)
        except Refusal as refusal:
            outcome = refusal.outcome
        except quorum.Unavailable as error:
            outcome = Outcome.refused(503, "UNAVAILABLE", f"{error}; nothing was sent")
        except names.BadName as error:
            outcome = Outcome.refused(400, "BAD_REQUEST", str(error))
        except Exception as error:
            log.exception("kv_request_failed", op=request.op)
            outcome = Outcome.refused(503, "UNAVAILABLE", f"replicator error: {error}")
        _LATENCY.labels(request.op, outcome.code or "ok").observe(time.perf_counter() - started)
        _HINTS_HELD.set(self.replicas.local.store.hint_bytes)
        return outcome

    async def drain(self) -> None:
        await self.once.drain(5.0)
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- operations ------------------------------------------------------------------------

    async def _run(self, request: schemas.KvRequest) -> Outcome:
        if not self.peers.resolved:
            raise Refusal(503, "UNAVAILABLE", "the replicator does not know every peer yet")
        for _ in range(ADMISSION_WAITS):
            if self.peers.admitted:
                break
            await asyncio.sleep(0.05)
        else:
            raise Refusal(503, "UNAVAILABLE", "the replicator is joining a membership change")
        if request.op == "ns_put":
            return await self._ns_put(request)
        if request.op in ("view", "view_change", "forget"):
            if self.view_ops is None:
                raise Refusal(503, "UNAVAILABLE", "membership changes are not wired here")
            return await self.view_ops(request)
        namespace = await self._authorized(request)
        r, w = namespace.quorum(request.r, request.w)
        names.check_key(request.key)
        target = _Target(namespace.n, request.ns, request.key)
        handlers = {
            "put": self._put,
            "get": self._get,
            "delete": self._delete,
            "members": self._members,
            "list_members": self._list_members,
            "field_put": self._field_put,
            "field_get": self._field_get,
            "field_delete": self._field_delete,
            "list_fields": self._list_fields,
        }
        return await handlers[request.op](request, target, r, w)

    async def _authorized(self, request: schemas.KvRequest) -> names.Namespace:
        system = names.system_namespace(request.ns, self.peers.site_count)
        if system is not None:
            if not request.admin:
                raise Refusal(403, "FORBIDDEN", f"{request.ns} is for Relay's own services")
            return system
        names.check_namespace(request.ns)
        cached = self._namespaces.get(request.ns)
        if cached is not None and cached[1] > time.monotonic():
            namespace = cached[0]
        else:
            # One read per namespace at a time: every request waiting for it shares the answer.
            lookup = self._lookups.get(request.ns)
            if lookup is None:
                lookup = asyncio.ensure_future(self._lookup(request.ns))
                self._lookups[request.ns] = lookup
                lookup.add_done_callback(lambda _: self._lookups.pop(request.ns, None))
            namespace = await asyncio.shield(lookup)
        if not namespace.accepts(request.token_sha256):
            raise Refusal(401, "AUTH", "missing or wrong namespace token")
        return namespace

    async def _lookup(self, ns: str) -> names.Namespace:
        found = await self._read(self._ns_target(ns), self._ns_quorum())
        if not isinstance(found, crdt.Register) or found.value is None:
            raise Refusal(404, "NOT_FOUND", f"no namespace {ns!r}")
        namespace = names.Namespace.decode(found.value)
        self._namespaces[ns] = (namespace, time.monotonic() + NS_CACHE_S)
        return namespace

    def _ns_target(self, namespace: str) -> _Target:
        return _Target(NS_N, names.NAMESPACES, namespace)

    def _ns_quorum(self) -> int:
        return min(NS_N, self.peers.site_count) // 2 + 1

    async def _ns_put(self, request: schemas.KvRequest) -> Outcome:
        if not request.admin:
            raise Refusal(403, "FORBIDDEN", "admin token missing or wrong")
        names.check_namespace(request.ns)
        target = self._ns_target(request.ns)
        existing = await self._read(target, self._ns_quorum())
        n = request.n or 3
        if n > self.peers.site_count:
            raise _bad(f"n={n} but only {self.peers.site_count} replicator sites exist")
        if isinstance(existing, crdt.Register) and existing.value is not None:
            old = names.Namespace.decode(existing.value)
            if old.n != n:
                raise _bad(f"namespace {request.ns!r} has n={old.n}; n cannot change")
        token = secrets.token_urlsafe(32)
        namespace = names.Namespace(
            n=n,
            r=request.r or (n // 2 + 1),
            w=request.w or (n // 2 + 1),
            gc_grace_s=864_000 if request.gc_grace_s is None else request.gc_grace_s,
            token_sha256=names.token_hash(token),
        )
        await self._write_register(target, namespace.encode(), None, self._ns_quorum())
        self._namespaces[request.ns] = (namespace, time.monotonic() + NS_CACHE_S)
        answer = schemas.KvNamespace(
            token=token,
            n=namespace.n,
            r=namespace.r,
            w=namespace.w,
            gc_grace_s=namespace.gc_grace_s,
        )
        return Outcome(200, answer.model_dump())

    def _value(self, request: schemas.KvRequest) -> bytes:
        if request.value is None:
            raise _bad("value is required")
        try:
            value = b64.unb64u(request.value)
        except ValueError:
            raise _bad("value is not base64url") from None
        if len(value) > self.settings.max_value_bytes:
            raise Refusal(413, "TOO_LARGE", f"value over {self.settings.max_value_bytes} bytes")
        return value

    def _expiry(self, request: schemas.KvRequest) -> int | None:
        return None if request.ttl_s is None else self.now_ms() + request.ttl_s * 1000

    async def _put(self, request: schemas.KvRequest, target: _Target, r: int, w: int) -> Outcome:
        version = await self._write_register(target, self._value(request), self._expiry(request), w)
        return Outcome(200, _version_body(version))

    async def _get(self, request: schemas.KvRequest, target: _Target, r: int, w: int) -> Outcome:
        value = await self._read(target, r)
        if value is not None and not isinstance(value, crdt.Register):
            _check_type(value, crdt.Register, self.now_ms())
        if not isinstance(value, crdt.Register) or value.visible(self.now_ms()) is None:
            raise Refusal(404, "NOT_FOUND", "no such key")
        return Outcome(200, _register_body(value))

    async def _delete(self, request: schemas.KvRequest, target: _Target, r: int, w: int) -> Outcome:
        async with self._lock(target):
            current = await self._read(target, r)
            version = self._stamp([current])
            if isinstance(current, crdt.AWSet):
                await self._delete_set(target, current, version, r, w)
            else:
                await self._write_checked(
                    [(target, ops.delete(current, version, self.now_ms()))], w
                )
        return Outcome(200, _version_body(version))

    async def _delete_set(
        self, target: _Target, head: crdt.AWSet, version: Version, r: int, w: int
    ) -> None:
        """Remove every member observed, a page of rows at a time (each page one write round
        with the head, so an interrupted delete has removed whole pages)."""
        async for rows, after, bound in self._row_pages(target, r, None, SET_PAGE):
            found = dict(rows)
            legacy = [m for m in head.entries if _within(m, after, bound) and m not in found]
            observed = [m for m, row in rows if setrows.element(head, row, m).entries] + legacy
            if observed or bound is None:
                head, written = setrows.change(
                    head, {**found, **dict.fromkeys(legacy)}, [], observed, version, None
                )
                await self._write_checked(
                    [(target, head), *((target.row(m), row) for m, row in written.items())], w
                )

    async def _members(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        try:
            add = [b64.unb64u(m) for m in request.add]
            remove = [b64.unb64u(m) for m in request.remove]
        except ValueError:
            raise _bad("members are base64url") from None
        if not add and not remove:
            raise _bad("nothing to add or remove")
        if any(len(m) > self.settings.max_value_bytes for m in add):
            raise Refusal(413, "TOO_LARGE", f"member over {self.settings.max_value_bytes} bytes")
        touched = list(dict.fromkeys([*remove, *add]))
        async with self._lock(target):
            head, *rows = await self._read_many([target, *(target.row(m) for m in touched)], r)
            _check_type(head, crdt.AWSet, self.now_ms())
            version = self._stamp([head, *rows])
            new_head, written = setrows.change(
                head if isinstance(head, crdt.AWSet) else None,
                {
                    m: row if isinstance(row, crdt.AWSet) else None
                    for m, row in zip(touched, rows, strict=True)
                },
                add,
                remove,
                version,
                self._expiry(request),
            )
            await self._write_checked(
                [(target, new_head), *((target.row(m), row) for m, row in written.items())], w
            )
        return Outcome(200, _version_body(version))

    async def _list_members(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        head = await self._read(target, r)
        _check_type(head, crdt.AWSet, self.now_ms())
        found: list[bytes] = []
        if isinstance(head, crdt.AWSet):
            cursor = _cursor(request.cursor)
            async for rows, after, bound in self._row_pages(target, r, cursor, request.limit + 1):
                shown = setrows.members(head, rows, self.now_ms())
                found.extend(m for m in shown if _within(m, after, bound))
                if len(found) > request.limit:
                    break
        page = found[: request.limit]
        more = page[-1] if len(found) > request.limit else None
        answer = schemas.KvMembers(
            members=[b64.b64u(m) for m in page], cursor=None if more is None else b64.b64u(more)
        )
        return Outcome(200, answer.model_dump())

    async def _field_put(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        names.check_key(request.field, "field")
        value = self._value(request)
        await self._check_map(target, await self._read(target, r), r)
        version = await self._write_lww(
            target,
            lambda v: crdt.KvMap({request.field: crdt.Register(v, value, self._expiry(request))}),
            w,
        )
        return Outcome(200, _version_body(version))

    async def _field_get(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        names.check_key(request.field, "field")
        value = await self._read(target, r)
        await self._check_map(target, value, r)
        register = value.fields.get(request.field) if isinstance(value, crdt.KvMap) else None
        if register is None or register.visible(self.now_ms()) is None:
            raise Refusal(404, "NOT_FOUND", "no such field")
        return Outcome(200, _register_body(register))

    async def _field_delete(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        names.check_key(request.field, "field")
        await self._check_map(target, await self._read(target, r), r)
        version = await self._write_lww(
            target, lambda v: crdt.KvMap({request.field: crdt.Register(v, None)}), w
        )
        return Outcome(200, _version_body(version))

    async def _list_fields(
        self, request: schemas.KvRequest, target: _Target, r: int, w: int
    ) -> Outcome:
        value = await self._read(target, r)
        await self._check_map(target, value, r)
        fields = value.visible(self.now_ms()) if isinstance(value, crdt.KvMap) else {}
        page, more = ops.page(
            sorted(fields.items(), key=lambda item: item[0].encode()),
            lambda item: item[0].encode(),
            _cursor(request.cursor),
            request.limit,
        )
        answer = schemas.KvFields(
            fields=[
                schemas.KvField(
                    field=name, value=b64.b64u(reg.value or b""), version=str(reg.version)
                )
                for name, reg in page
            ],
            cursor=None if more is None else b64.b64u(more),
        )
        return Outcome(200, answer.model_dump())

    async def _check_map(self, target: _Target, current: crdt.Value | None, r: int) -> None:
        """Refuse a map operation on a key of another type. A map wins the merge over a set's
        head, which shows no member itself: whether the set shows any is read from its rows."""
        _check_type(current, crdt.KvMap, self.now_ms())
        if isinstance(current, crdt.AWSet):
            async for rows, after, bound in self._row_pages(target, r, None, SET_PAGE):
                shown = setrows.members(current, rows, self.now_ms())
                if any(_within(m, after, bound) for m in shown):
                    raise _bad("key holds a set")

    # -- quorum machinery ------------------------------------------------------------------

    def _lock(self, target: _Target) -> asyncio.Lock:
        key = (target.namespace, target.key)
        lock = self._locks.get(key)
        if lock is None:
            if len(self._locks) > 10_000:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _stamp(self, read: list[crdt.Value | None]) -> Version:
        """A version past everything the values read carry."""
        for value in read:
            for version in [] if value is None else ops.versions(value):
                if self.clock.admissible(version):
                    self.clock.observe(version)
        return self.clock.tick()

    async def _write_register(
        self, target: _Target, value: bytes | None, expires_at: int | None, w: int
    ) -> Version:
        return await self._write_lww(target, lambda v: crdt.Register(v, value, expires_at), w)

    async def _write_lww(
        self, target: _Target, make: Callable[[Version], crdt.Value], w: int
    ) -> Version:
        """Stamp, write, and stamp again past any newer version a replica reports."""
        for _ in range(MAX_RESENDS):
            version = self.clock.tick()
            results = await self._write_checked([(target, make(version))], w)
            newer = [Version.parse(r[0]["newer"]) for r in results if r[0].get("newer")]
            if not newer:
                return version
            _RESENDS.inc()
            self.clock.observe(max(newer))
        return version

    async def _write_checked(
        self, writes: list[tuple[_Target, crdt.Value]], w: int
    ) -> list[list[dict[str, Any]]]:
        """Write and check each replica's answers: a value that lost to one of another type
        (whose rank wins the merge, `relay_kv.crdt`) took no effect, so it is refused."""
        outcome, results = await self._write(writes, w)
        for answer in results:
            for result, (_, value) in zip(answer, writes, strict=True):
                if result.get("type") not in (None, ops.type_name(value)):
                    raise _bad(f"key holds a {result['type']}")
        if outcome is not quorum.Outcome.OK:
            raise Refusal(
                504,
                "INDETERMINATE",
                f"fewer than {w} replicas acknowledged within {self.settings.timeout_s:g} s; "
                "the write may or may not become visible; retrying is safe",
            )
        return results

    async def _write(
        self, writes: list[tuple[_Target, crdt.Value]], w: int
    ) -> tuple[quorum.Outcome, list[list[dict[str, Any]]]]:
        """One write round for values of one shard (a key, or a set's head and rows): each
        replica takes them in one batch, so it acknowledges all or none."""
        target = writes[0][0]
        change = self.peers.change
        round_: quorum.WriteRound | membership.JointWriteRound
        if change is None:
            home = self.peers.view.replicas(target.shard, target.n)
            plan = quorum.plan_write(home, self.peers.reachable(), w)
            round_ = quorum.WriteRound(plan.targets, w)
        else:
            joint = change.replicas(target.shard, target.n)
            w_new = None
            if target.majorities:
                w, w_new = membership.majorities(joint)
            plan = membership.plan_write(joint, self.peers.reachable(), w, w_new)
            round_ = membership.JointWriteRound(joint, plan.targets, w, w_new)
            # Hints for either set's home replicas, on an old fallback that is no target.
            home = placement.Replicas(
                joint.home, tuple(s for s in joint.old.fallback if s not in joint.home)
            )
        decided = asyncio.Event()
        results: list[list[dict[str, Any]]] = []
        items = [(t.n, t.namespace, t.key, value) for t, value in writes]

        async def send(site: str) -> None:
            try:
                answer = await asyncio.wait_for(
                    self.replicas.write(site, items), self.settings.timeout_s
                )
                round_.ack(site)
                results.append(answer)
            except (PeerError, Refused, TimeoutError) as error:
                log.debug("kv_replica_write_failed", site=site, error=repr(error))
                if isinstance(error, TimeoutError) and site != self.peers.me:
                    self.peers.mark_down(site)  # `Peers.call` marks its own failures
                round_.fail(site)
                await self._hint(home, site, items)
            finally:
                if round_.decided is not None:
                    decided.set()

        for site in plan.targets:
            self._spawn(send(site))
        for site in plan.hints:
            self._spawn(self._hint(home, site, items))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(decided.wait(), self.settings.timeout_s)
        return round_.final(), list(results)

    async def _hint(
        self,
        home: placement.Replicas,
        site: str,
        items: list[tuple[int, str, str, crdt.Value]],
    ) -> None:
        helper = quorum.fallback_for(home, self.peers.reachable())
        if helper is None:
            return
        try:
            await asyncio.wait_for(
                self.replicas.write(helper, items, hint_for=site), self.settings.timeout_s
            )
            _HINTS_SENT.inc()
        except (PeerError, Refused, TimeoutError) as error:
            log.info("kv_hint_not_stored", target=site, helper=helper, error=str(error))

    def _read_plan(self, target: _Target, r: int) -> tuple[tuple[str, ...], int]:
        """The sites a read of `target`'s shard asks, and how many must answer."""
        change = self.peers.change
        if change is None:
            home = self.peers.view.replicas(target.shard, target.n)
            return quorum.plan_read(home, self.peers.reachable(), r), r
        joint = change.replicas(target.shard, target.n)
        if target.majorities:
            r_old, r_new = membership.majorities(joint)
            r = r_new if change.step is membership.Step.READING_NEW else r_old
        return membership.plan_read(joint, self.peers.reachable(), r, change.step), r

    async def _ask(
        self, target: _Target, r: int, ask: Callable[[str], Awaitable[T]]
    ) -> tuple[dict[str, T], list[asyncio.Task[None]]]:
        """Ask the sites a read plans until R answered: the answers (a late one is added
        when it comes), and the asks still running; `quorum.Unavailable` when R cannot answer
        in time."""
        sites, r = self._read_plan(target, r)
        round_ = quorum.ReadRound(sites, r)
        answers: dict[str, T] = {}
        decided = asyncio.Event()

        async def one(site: str) -> None:
            try:
                answers[site] = await asyncio.wait_for(ask(site), self.settings.timeout_s)
                round_.answer(site, None)
            except (PeerError, TimeoutError):
                round_.fail(site)
            finally:
                if round_.decided is not None:
                    decided.set()

        asks = [asyncio.create_task(one(site)) for site in sites]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(decided.wait(), self.settings.timeout_s)
        if round_.decided is not quorum.Outcome.OK:
            for task in asks:
                task.cancel()
            raise quorum.Unavailable(f"{len(round_.answers)} of {r} replicas answered in time")
        return answers, [task for task in asks if not task.done()]

    async def _read(self, target: _Target, r: int) -> crdt.Value | None:
        return (await self._read_many([target], r))[0]

    async def _read_many(self, targets: list[_Target], r: int) -> list[crdt.Value | None]:
        """Values of one shard (a key, or a set's head and rows) read with one call per
        replica: after R answered, merged; stale replicas among the R are repaired before the
        answer, late ones in the background."""
        items = [(t.n, t.namespace, t.key) for t in targets]
        answers, late = await self._ask(targets[0], r, lambda site: self.replicas.read(site, items))
        answered = dict(answers)
        merged = [crdt.merge_all(values) for values in zip(*answered.values(), strict=True)]
        stale = {site: _outdated(targets, values, merged) for site, values in answered.items()}
        if any(stale.values()):  # blocking read repair of the stale replicas among the R
            _REPAIRS.labels("blocking").inc(sum(1 for items in stale.values() if items))
            await asyncio.gather(
                *(self._repair(site, items) for site, items in stale.items() if items),
                return_exceptions=True,
            )
        await self._carry_to_new(
            targets[0], [t.item(v) for t, v in zip(targets, merged, strict=True) if v is not None]
        )
        if late:
            self._spawn(self._repair_late(late, answers, set(answered), targets, merged))
        return merged

    async def _read_rows(
        self, target: _Target, r: int, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, crdt.AWSet]], bytes | None]:
        """A page of a set's member rows after the member `after`, merged from R replicas:
        (member, row) in member order, and the last member the page is exact up to (None: the
        rows end). Each replica answers up to `limit` rows; past the least last row of a
        replica that has more, another replica's rows may lack that one's, so they wait for
        the next page."""
        start = None if after is None else target.row(after).key
        answers, _ = await self._ask(
            target, r, lambda site: self.replicas.rows(site, target, start, limit)
        )
        ends = [found[-1][0] for found, more in answers.values() if more and found]
        bound = min(ends, key=str.encode) if ends else None
        merged: dict[str, crdt.Value] = {}
        for found, _ in answers.values():
            for row, value in found:
                if bound is None or row.encode() <= bound.encode():
                    mine = merged.get(row)
                    merged[row] = value if mine is None else crdt.merge(mine, value)
        rows = [
            (setrows.member_of(row), value)
            for row, value in sorted(merged.items(), key=lambda item: item[0].encode())
            if isinstance(value, crdt.AWSet)
        ]
        await self._carry_to_new(target, [target.row(m).item(value) for m, value in rows])
        return rows, None if bound is None else setrows.member_of(bound)

    async def _row_pages(
        self, target: _Target, r: int, after: bytes | None, limit: int
    ) -> AsyncIterator[tuple[list[tuple[bytes, crdt.AWSet]], bytes | None, bytes | None]]:
        """A set's rows page by page after the member `after` (`_read_rows`): each page's rows,
        the member it starts after and the one it is exact up to (None: the rows end there)."""
        while True:
            rows, bound = await self._read_rows(target, r, after, limit)
            yield rows, after, bound
            if bound is None:
                return
            after = bound

    async def _carry_to_new(
        self, target: _Target, items: list[tuple[int, str, str, crdt.Value]]
    ) -> None:
        """During a change's pull, what a read returned must stay visible once reads move to
        the new home replicas (a value in flight, not acknowledged, may be on the old ones
        only): it is written to the reachable new ones too before the answer."""
        change = self.peers.change
        if change is None or change.step is not membership.Step.PULLING or not items:
            return
        joint = change.replicas(target.shard, target.n)
        reachable = self.peers.reachable()
        extra = [s for s in joint.new.home if s not in joint.old.home and s in reachable]
        await asyncio.gather(*(self._repair(s, items) for s in extra), return_exceptions=True)

    async def _repair(self, site: str, items: list[tuple[int, str, str, crdt.Value]]) -> None:
        await asyncio.wait_for(self.replicas.write(site, items), self.settings.timeout_s)

    async def _repair_late(
        self,
        late: list[asyncio.Task[None]],
        answers: dict[str, list[crdt.Value | None]],
        seen: set[str],
        targets: list[_Target],
        merged: list[crdt.Value | None],
    ) -> None:
        await asyncio.gather(*late, return_exceptions=True)
        for site, values in list(answers.items()):
            items = [] if site in seen else _outdated(targets, values, merged)
            if items:
                _REPAIRS.labels("background").inc()
                with contextlib.suppress(PeerError, Refused, TimeoutError):
                    await self._repair(site, items)


@dataclass(frozen=True)
class _Target:
    n: int
    namespace: str
    key: str

    @property
    def shard(self) -> int:
        return placement.shard_of(self.namespace, self.key)

    def row(self, member: bytes) -> _Target:
        """The row of one member of the set at this key (`relay_kv.setrows`)."""
        return _Target(self.n, self.namespace, setrows.row_key(self.key, member))

    def item(self, value: crdt.Value) -> tuple[int, str, str, crdt.Value]:
        """A replica write's item for `value` at this key."""
        return (self.n, self.namespace, self.key, value)

    @property
    def majorities(self) -> bool:
        """Relay's own namespaces: R and W are a majority of the home replicas that exist (per
        view during a membership change), not a namespace definition's."""
        return self.namespace == names.NAMESPACES or self.namespace in names.SYSTEM


def _outdated(
    targets: list[_Target], values: list[crdt.Value | None], merged: list[crdt.Value | None]
) -> list[tuple[int, str, str, crdt.Value]]:
    """The writes that bring a replica's `values` up to the merge."""
    return [
        t.item(m)
        for t, v, m in zip(targets, values, merged, strict=True)
        if m is not None and v != m
    ]


def _within(member: bytes, after: bytes | None, bound: bytes | None) -> bool:
    """Whether `member` is on the page after `after` up to `bound` (None: unbounded)."""
    return (after is None or member > after) and (bound is None or member <= bound)


def _check_type(current: crdt.Value | None, wanted: type[crdt.Value], now_ms: int) -> None:
    try:
        ops.check_type(current, wanted, now_ms)
    except ops.WrongType as error:
        raise _bad(str(error)) from None


def _register_body(register: crdt.Register) -> dict[str, Any]:
    answer = schemas.KvRegister(
        value=b64.b64u(register.value or b""),
        version=str(register.version),
        expires_at=register.expires_at,
    )
    return answer.model_dump()


def _version_body(version: Version) -> dict[str, Any]:
    return schemas.KvVersion(version=str(version)).model_dump()


def _cursor(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return b64.unb64u(text)
    except ValueError:
        raise _bad("cursor is not base64url") from None
