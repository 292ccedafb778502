"""A write that starts after another was acknowledged wins, even when its coordinator's clock is
three seconds behind: a replica holding the newer version says so, the coordinator moves its
clock past it and writes again.

Four replicators built from their real settings, served in process on real sockets (uvicorn),
with their stores on real files; the coordinators are called directly (no Kafka needed: this is
about the coordinator and its replicas). D is not a home replica of the key, so it has never
observed the first write's version: only the replicas' answers can tell it.
"""

from __future__ import annotations

from pathlib import Path

from relay_durable.codec import b64u, unb64u
from relay_kv import names, placement
from relay_kv.clock import Version
from tests.kv.inprocess import replicators, request


async def test_a_later_write_wins_over_a_lagging_coordinators_clock(tmp_path: Path) -> None:
    offsets = {"A": 0, "B": 0, "C": 0, "D": -3000}
    async with replicators(tmp_path, offsets) as coordinators:
        sites = {name: c.peers.me for name, c in coordinators.items()}
        made = await coordinators["A"].run(request(op="ns_put", ns="skew", admin=True, n=3))
        assert made.ok, made
        assert made.data is not None
        token = {"token_sha256": names.token_hash(made.data["token"])}
        key = next(
            k
            for k in (f"k{i}" for i in range(1000))
            if sites["D"]
            not in placement.replicas(placement.shard_of("skew", k), list(sites.values()), 3).home
        )
        first = await coordinators["A"].run(
            request(op="put", ns="skew", key=key, value=b64u(b"first"), **token)
        )
        assert first.ok, first
        second = await coordinators["D"].run(  # starts after `first` was acknowledged
            request(op="put", ns="skew", key=key, value=b64u(b"second"), **token)
        )
        assert second.ok, second
        assert first.data is not None
        assert second.data is not None
        assert Version.parse(second.data["version"]) > Version.parse(first.data["version"])
        read = await coordinators["B"].run(request(op="get", ns="skew", key=key, r=3, **token))
        assert read.data is not None
        assert unb64u(read.data["value"]) == b"second"
