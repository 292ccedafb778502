"""Sets stored as rows between real replicators (in process, real sockets and stores): an
operation writes the head and the rows it touches, whatever the set's size; listings page
through rows merged from R replicas; a set written whole by an older version reads the same and
moves into rows member by member; a whole-set delete removes every member; garbage collection
keeps a set's head while any of its rows remains."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from relay_durable.codec import b64u, unb64u
from relay_kv import codec, names, placement, setrows
from relay_kv.clock import Version
from relay_kv.crdt import AWSet
from relay_replicator.coordinator import Coordinator
from relay_replicator.store import Write
from relay_replicator.sync import Sync
from tests.kv.inprocess import replicators, request

SITES = {"A": 0, "B": 0, "C": 0}
DAY_MS = 86_400_000


async def _namespace(a: Coordinator) -> dict[str, Any]:
    made = await a.run(request(op="ns_put", ns="app", admin=True, n=3))
    assert made.data is not None
    return {"ns": "app", "key": "s", "token_sha256": names.token_hash(made.data["token"])}


async def _change(a: Coordinator, auth: dict[str, Any], **members: list[bytes]) -> None:
    fields = {k: tuple(b64u(m) for m in v) for k, v in members.items()}
    outcome = await a.run(request(op="members", **auth, **fields))
    assert outcome.ok, outcome


async def _list(a: Coordinator, auth: dict[str, Any], limit: int, r: int = 2) -> list[bytes]:
    """Every member, page by page."""
    found: list[bytes] = []
    cursor = None
    while True:
        outcome = await a.run(request(op="list_members", **auth, limit=limit, cursor=cursor, r=r))
        assert outcome.ok, outcome
        assert outcome.data is not None
        page = [unb64u(m) for m in outcome.data["members"]]
        assert len(page) <= limit
        found.extend(page)
        cursor = outcome.data["cursor"]
        if cursor is None:
            return found
        assert page, "a cursor after an empty page"


def _stored(coordinator: Coordinator, key: str) -> Any:
    shard = placement.shard_of("app", key)
    return coordinator.replicas.local.store.get(3, shard, "app", key)


async def test_a_large_set_lives_in_rows_and_pages_exactly(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES) as coordinators:
        a, b = coordinators["A"], coordinators["B"]
        auth = await _namespace(a)
        members = [i.to_bytes(2, "big") + b"m" * 40 for i in range(1500)]
        for start in range(0, len(members), 100):
            await _change(a, auth, add=members[start : start + 100])
        for coordinator in coordinators.values():
            head = _stored(coordinator, "s")
            assert isinstance(head, AWSet)
            assert head.entries == {}  # the head holds no member: its size is the set's own
            assert len(codec.encode(head)) < 200
            row = _stored(coordinator, setrows.row_key("s", members[7]))
            assert isinstance(row, AWSet)
            assert list(row.entries) == [members[7]]
        assert await _list(a, auth, limit=250) == members
        assert await _list(b, auth, limit=7, r=3) == members

        # Adds that reached C alone, between the others' rows: a page is exact only up to the
        # least last row of the replicas that have more.
        c = coordinators["C"]
        extra = [i.to_bytes(2, "big") + b"x" for i in range(0, 1500, 3)]
        version = Version(int(time.time() * 1000), 0, c.peers.me)
        await c.replicas.local.store.merge(
            [
                Write(3, placement.shard_of("app", "s"), "app", setrows.row_key("s", m), row)
                for m in extra
                for row in [AWSet().add([m], version)]
            ]
        )
        assert await _list(b, auth, limit=7, r=3) == sorted(members + extra)

        removed = members[::2]
        await _change(b, auth, remove=removed, add=[members[0]])  # add wins within one op
        kept = [members[0], *members[1::2]]
        assert await _list(a, auth, limit=333, r=3) == sorted(kept + extra)

        # A map would win the merge over the head: refused while the set shows a member.
        field = {**auth, "field": "f"}
        for op in ("field_put", "field_delete", "field_get", "list_fields"):
            outcome = await a.run(request(op=op, **field, value=b64u(b"v")))
            assert outcome.code == "BAD_REQUEST", (op, outcome)
        assert isinstance(_stored(b, "s"), AWSet)

        deleted = await a.run(request(op="delete", **auth))
        assert deleted.ok, deleted
        assert await _list(b, auth, limit=100, r=3) == []
        refused = await a.run(request(op="put", **{**auth, "value": b64u(b"v")}))
        assert refused.code == "BAD_REQUEST"  # the head still marks a set
        again = await a.run(request(op="get", **auth))
        assert again.code == "BAD_REQUEST"
        assert (await a.run(request(op="field_put", **field, value=b64u(b"v")))).ok


async def test_a_set_written_whole_reads_the_same_and_moves_into_rows(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES) as coordinators:
        a = coordinators["A"]
        auth = await _namespace(a)
        site = a.peers.me
        whole = AWSet().add([b"a", b"b", b"c", b"d"], Version(1_000, 0, site))
        whole = whole.remove([b"d"], Version(1_001, 0, site))
        older = AWSet().add([b"a", b"b", b"c", b"d"], Version(1_000, 0, site))
        shard = placement.shard_of("app", "s")
        for name, coordinator in coordinators.items():  # as an older version stored it
            held = older if name == "C" else whole  # C missed the remove of d
            await coordinator.replicas.local.store.merge([Write(3, shard, "app", "s", held)])

        assert await _list(a, auth, limit=2, r=2) == [b"a", b"b", b"c"]
        assert await _list(a, auth, limit=2, r=3) == [b"a", b"b", b"c"]
        await _change(a, auth, remove=[b"b"], add=[b"e"])
        assert await _list(a, auth, limit=10, r=3) == [b"a", b"c", b"e"]
        head = _stored(a, "s")
        assert isinstance(head, AWSet)
        assert sorted(head.entries) == [b"a", b"c"]  # b moved into its row, removed there
        row = _stored(a, setrows.row_key("s", b"b"))
        assert isinstance(row, AWSet)
        assert row.entries == {}
        assert row.covers(next(iter(whole.entries[b"b"])))

        deleted = await a.run(request(op="delete", **auth, r=3, w=3))
        assert deleted.ok, deleted
        assert await _list(a, auth, limit=10, r=3) == []
        for coordinator in coordinators.values():
            head = _stored(coordinator, "s")
            assert isinstance(head, AWSet)
            assert head.entries == {}


async def test_garbage_collection_keeps_a_head_while_its_rows_remain(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES) as coordinators:
        a = coordinators["A"]
        auth = await _namespace(a)
        await _change(a, auth, add=[b"x", b"y"])
        await _change(a, auth, remove=[b"x"])
        later = int(time.time() * 1000) + 11 * DAY_MS  # past the default gc_grace of 10 days
        sync = Sync(a.replicas, lambda: later, 0, gc_guard=False)
        assert await sync.collect_garbage() == 1  # x's tombstone row
        assert _stored(a, setrows.row_key("s", b"x")) is None
        assert isinstance(_stored(a, "s"), AWSet)  # y's row remains: the head stays
        await _change(a, auth, remove=[b"y"])
        sync.now_ms = lambda: int(time.time() * 1000) + 11 * DAY_MS
        assert await sync.collect_garbage() == 1  # y's row; the head saw it still there
        assert await sync.collect_garbage() == 1  # then the head
        assert _stored(a, "s") is None
        assert a.replicas.local.store.check() == []
