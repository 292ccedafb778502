"""The coordinator's and the replicas' refusals, in process over real sockets: each answers the
API's code and stores nothing; a replica refuses a version too far ahead of its clock; a hint
past its age is dropped, not handed over."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from relay_bus import schemas
from relay_durable.codec import b64u
from relay_kv import hints, names, placement
from relay_kv.clock import Version
from relay_kv.crdt import Register
from relay_replicator.handoff import Handoff
from relay_replicator.peers import PeerError
from relay_replicator.replica import Refused
from tests.kv.inprocess import replicators, request

SITES = {"A": 0, "B": 0, "C": 0}


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_refused_requests_answer_their_code_and_store_nothing(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES, max_value_bytes=1024) as coordinators:
        a = coordinators["A"]
        made = await a.run(request(op="ns_put", ns="app", admin=True, n=3))
        assert made.data is not None
        token = names.token_hash(made.data["token"])

        async def code(**fields: object) -> str | None:
            return (await a.run(request(**fields))).code  # type: ignore[arg-type]

        put = {"op": "put", "ns": "app", "key": "k", "token_sha256": token}
        assert await code(op="ns_put", ns="other", n=3) == "FORBIDDEN"  # not admin
        assert await code(op="ns_put", ns="big", admin=True, n=4) == "BAD_REQUEST"  # > sites
        assert await code(op="ns_put", ns="app", admin=True, n=2) == "BAD_REQUEST"  # n fixed
        assert await code(**{**put, "ns": "nope"}, value=b64u(b"v")) == "NOT_FOUND"
        assert await code(**{**put, "token_sha256": "0" * 64}, value=b64u(b"v")) == "AUTH"
        assert await code(op="put", ns="$retained", key="t", value=b64u(b"v")) == "FORBIDDEN"
        assert await code(**put, value=b64u(b"v"), w=4) == "BAD_REQUEST"
        assert await code(**put, value=b64u(b"x" * 1025)) == "TOO_LARGE"
        assert await code(**put, value="not base64!") == "BAD_REQUEST"
        assert await code(**put) == "BAD_REQUEST"  # no value
        assert await code(**{**put, "key": "a\0b"}, value=b64u(b"v")) == "BAD_REQUEST"
        shard = placement.shard_of("app", "k")
        for coordinator in coordinators.values():
            assert coordinator.replicas.local.store.get(3, shard, "app", "k") is None

        members = {"op": "members", "ns": "app", "key": "s", "token_sha256": token}
        assert (await a.run(request(**members, add=(b64u(b"m"),)))).ok  # type: ignore[arg-type]
        assert await code(**{**put, "key": "s"}, value=b64u(b"v")) == "BAD_REQUEST"  # a set
        assert await code(op="get", ns="app", key="s", token_sha256=token) == "BAD_REQUEST"


async def test_a_replica_refuses_a_version_too_far_ahead(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES) as coordinators:
        a, b = coordinators["A"], coordinators["B"]
        ahead = Register(Version(now_ms() + 60_000, 0, a.peers.me), b"from the future")
        with pytest.raises(PeerError, match="refused"):
            await a.replicas.write(b.peers.me, [(3, "app", "k", ahead)])
        with pytest.raises(Refused):
            await b.replicas.local.write([(3, "app", "k", ahead)])
        assert b.replicas.local.store.get(3, placement.shard_of("app", "k"), "app", "k") is None
        assert not b.peers.is_down(a.peers.me)  # a refusal is not a failure of the site


async def test_a_hint_past_its_age_is_dropped_not_handed_over(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES, hint_max_age_s=1) as coordinators:
        a, b = coordinators["A"], coordinators["B"]
        target = b.peers.me
        old = hints.Hint(target, 3, "app", "old", Register(Version(1, 0, a.peers.me), b"o"), 0)
        fresh = hints.Hint(
            target, 3, "app", "new", Register(Version(now_ms(), 0, a.peers.me), b"n"), now_ms()
        )
        store = a.replicas.local.store
        assert await store.add_hints([old, fresh])
        handed = await Handoff(a.replicas, now_ms, 1.0).replay_all()
        assert handed == 1
        b_store = b.replicas.local.store
        assert b_store.get(3, placement.shard_of("app", "new"), "app", "new") == fresh.value
        assert b_store.get(3, placement.shard_of("app", "old"), "app", "old") is None
        assert store.hints_for(target, 10) == []
        assert store.hint_bytes == 0


async def test_every_answer_is_the_schemas_model_of_its_operation(tmp_path: Path) -> None:
    """The coordinator builds each body as its `relay_bus.schemas` model: the ingress reads
    each back as the model of what it asked (`KvReply.answer`), and as no other."""
    async with replicators(tmp_path, SITES) as coordinators:
        a = coordinators["A"]
        answers: list[schemas.KvAnswer] = []

        async def ask(model: type[schemas.KvAnswer], **fields: Any) -> Any:
            outcome = await a.run(request(**fields))
            assert outcome.ok, outcome
            reply = schemas.KvReply(
                id="r", origin="o", instance="i", status=outcome.status, data=outcome.data
            )
            decoded = schemas.decode(schemas.encode(reply))
            assert isinstance(decoded, schemas.KvReply)
            answer = decoded.answer(model)
            assert answer is not None
            assert answer.model_dump() == outcome.data
            answers.append(answer)
            return answer

        made = await ask(schemas.KvNamespace, op="ns_put", ns="app", admin=True, n=3)
        assert (made.n, made.r, made.w, made.gc_grace_s) == (3, 2, 2, 864_000)
        auth = {"ns": "app", "token_sha256": names.token_hash(made.token)}
        put = await ask(schemas.KvVersion, op="put", key="k", value=b64u(b"v"), ttl_s=60, **auth)
        got = await ask(schemas.KvRegister, op="get", key="k", **auth)
        assert (got.value, got.version) == (b64u(b"v"), put.version)
        assert got.expires_at is not None
        await ask(schemas.KvVersion, op="delete", key="k", **auth)
        await ask(schemas.KvVersion, op="members", key="s", add=(b64u(b"m"),), **auth)
        members = await ask(schemas.KvMembers, op="list_members", key="s", **auth)
        assert (members.members, members.cursor) == ([b64u(b"m")], None)
        field = {"key": "h", "field": "f", **auth}
        await ask(schemas.KvVersion, op="field_put", value=b64u(b"x"), **field)
        one = await ask(schemas.KvRegister, op="field_get", **field)
        assert (one.value, one.expires_at) == (b64u(b"x"), None)
        fields = await ask(schemas.KvFields, op="list_fields", key="h", limit=1, **auth)
        assert [(f.field, f.value) for f in fields.fields] == [("f", b64u(b"x"))]
        await ask(schemas.KvVersion, op="field_delete", **field)
        state = await ask(schemas.KvMembership, op="view", ns="$members", admin=True)
        assert sorted(state.view.sites) == sorted(c.peers.me for c in coordinators.values())
        assert (state.change, state.down, state.max_n) == (None, [], 3)
        same = await ask(
            schemas.KvViewChanging,
            op="view_change",
            ns="$members",
            admin=True,
            sites=tuple(state.view.sites),
        )
        assert same.version == state.view.version
        for answer in answers:  # no body is read as another operation's
            reply = schemas.KvReply(
                id="r", origin="o", instance="i", status=200, data=answer.model_dump()
            )
            for other in {type(a) for a in answers} - {type(answer)}:
                with pytest.raises(schemas.SchemaError, match=f"not a {other.__name__}"):
                    reply.answer(other)
