"""Batched replica calls (`relay_replicator.peer_calls`), in process over real sockets: many
concurrent quorum writes and reads to the same peers leave in fewer HTTP calls than rounds,
and every caller gets its own answers (each key reads back the value written to it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from relay_durable.codec import b64u, unb64u
from relay_kv import names
from tests.kv.inprocess import replicators, request

SITES = {"A": 0, "B": 0, "C": 0}
ROUNDS = 60


async def test_concurrent_rounds_share_calls_and_keep_their_answers(tmp_path: Path) -> None:
    async with replicators(tmp_path, SITES) as coordinators:
        a = coordinators["A"]
        made = await a.run(request(op="ns_put", ns="app", admin=True, n=3))
        assert made.data is not None
        token = names.token_hash(made.data["token"])
        base = {"ns": "app", "token_sha256": token, "w": 3, "r": 3}
        writes_before = a.replicas.peer_writes.calls

        puts = await asyncio.gather(
            *(
                a.run(request(op="put", key=f"k{i}", value=b64u(f"value {i}".encode()), **base))
                for i in range(ROUNDS)
            )
        )
        assert all(outcome.ok for outcome in puts), [p.detail for p in puts if not p.ok]
        # Each round writes to both other sites (w=3): 2 * ROUNDS rounds-worth of items.
        write_calls = a.replicas.peer_writes.calls - writes_before
        assert 2 <= write_calls < 2 * ROUNDS

        reads_before = a.replicas.peer_reads.calls
        gets = await asyncio.gather(
            *(a.run(request(op="get", key=f"k{i}", **base)) for i in range(ROUNDS))
        )
        for i, outcome in enumerate(gets):
            assert outcome.ok, outcome.detail
            assert outcome.data is not None
            assert unb64u(outcome.data["value"]) == f"value {i}".encode()
        assert 2 <= a.replicas.peer_reads.calls - reads_before < 2 * ROUNDS

        # Every replica holds every value (w=3): the other sites got their own items.
        for name in ("B", "C"):
            local = coordinators[name].replicas.local
            values = local.read([(3, "app", f"k{i}") for i in range(ROUNDS)])
            assert all(v is not None for v in values)
