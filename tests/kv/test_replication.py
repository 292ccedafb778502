"""Replicated key-value data end to end: clients -> ingress -> Kafka -> a coordinating
replicator -> replicas over HTTP, with four real replicator processes on loopback and one
replica pair cut.

What it shows: the API's strings, sets and maps; with the pair (coordinator X, replica C) cut, a
W=3 write is INDETERMINATE (sent, not acknowledged by 3), the next one UNAVAILABLE (C known down,
nothing sent), a W=2 write OK with a hint for C kept by the fallback; C converges (the hint, and
anti-entropy after the heal) and every pair's tictac hashes agree again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from relay_durable.codec import b64u, unb64u
from relay_kv import placement
from relayctl import kv_commands
from tests import helpers
from tests.kv import cluster as kvc

PARTITIONS = 8
FAST = {
    "RELAY_KV__REPLICA_TIMEOUT_S": "1.0",
    "RELAY_KV__DOWN_S": "2.0",
    "RELAY_KV__HANDOFF_INTERVAL_S": "0.5",
    "RELAY_KV__SYNC_INTERVAL_S": "1.0",
}


def eventually(check: Callable[[], Any], budget: float = 30, what: str = "") -> Any:
    deadline = time.monotonic() + budget
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {budget} s: {what}")
        time.sleep(0.2)


def pick(
    running: kvc.Cluster, ns: str, held: dict[str, list[int]], prefix: str
) -> tuple[str, str, str, str, str]:
    """A key, its coordinator X (holding the key's partition), the other two home replicas Y
    and C, and the fallback D."""
    by_site = {r.site: name for name, r in running.replicators.items()}
    sites = list(by_site)
    for i in range(10_000):
        key = f"{prefix}{i}"
        shard = placement.shard_of(ns, key)
        home = [by_site[s] for s in placement.replicas(shard, sites, 3).home]
        coordinator = next(n for n, parts in held.items() if shard % PARTITIONS in parts)
        if coordinator in home:
            y, c = [n for n in home if n != coordinator]
            (d,) = [n for n in running.names if n not in home]
            return key, coordinator, y, c, d
    raise AssertionError("no key fits")


def value_of(raw: Any) -> bytes | None:
    if raw is None or raw.get("x") is None:
        return None
    return unb64u(raw["x"])


def metric(replica: kvc.Replicator, name: str) -> float:
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def divergence(running: kvc.Cluster) -> dict[tuple[str, str, int], list[int]]:
    """`relayctl kv divergence`'s report, by replicator names: the pairs that differ."""
    names = {r.site: name for name, r in running.replicators.items()}
    report = kv_commands.divergence_report([r.url for r in running.replicators.values()], kvc.TOKEN)
    return {(names[a], names[b], n): shards for a, b, n, shards in report if shards}


def test_strings_sets_and_maps_through_the_ingress_and_a_cut_pair(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    with kvc.cluster(tmp_path, kafka, redis_url, **FAST) as running:
        client = kvc.Client(running.ingress_url)
        made = client.namespace("app", n=3, r=2, w=2, gc_grace_s=3600)
        assert made.status_code == 200, made.text
        client.token = made.json()["token"]

        # -- the API, every replica up --------------------------------------------------
        put = client.put("app", "greeting", b"hello")
        assert put.status_code == 200, put.text
        got = client.get("app", "greeting")
        assert got.status_code == 200, got.text
        assert unb64u(got.json()["value"]) == b"hello"
        assert got.json()["version"] == put.json()["version"]
        assert client.put("app", "greeting", b"again").json()["version"] > put.json()["version"]
        assert client.get("app", "missing").json()["error"] == "NOT_FOUND"
        assert kvc.Client(running.ingress_url, "wrong").get("app", "greeting").status_code == 401
        assert client.delete("app", "greeting").status_code == 200
        assert client.get("app", "greeting").status_code == 404

        assert client.members("app", "team", add=[b"ann", b"bob", b"cy"]).status_code == 200
        assert client.members("app", "team", remove=[b"bob"], add=[b"dee"]).status_code == 200
        listed = client.list_members("app", "team", limit=2).json()
        assert [unb64u(m) for m in listed["members"]] == [b"ann", b"cy"]
        rest = client.list_members("app", "team", limit=2, cursor=listed["cursor"]).json()
        assert [unb64u(m) for m in rest["members"]] == [b"dee"]
        assert rest["cursor"] is None
        wrong_type = client.put("app", "team", b"x")
        assert wrong_type.status_code == 400, wrong_type.text

        assert client.field("PUT", "app", "profile", "name", b"Ann").status_code == 200
        assert client.field("PUT", "app", "profile", "city", b"Oslo").status_code == 200
        assert client.field("DELETE", "app", "profile", "city").status_code == 200
        fields = client.list_fields("app", "profile").json()["fields"]
        assert [(f["field"], unb64u(f["value"])) for f in fields] == [("name", b"Ann")]
        assert client.field("GET", "app", "profile", "city").status_code == 404

        # -- cut the pair (coordinator X, replica C) -------------------------------------
        held = running.wait_for_partitions()
        key, x, _, c, d = pick(running, "app", held, "cut-")
        running.cut(x, c)
        indeterminate = client.put("app", key, b"v1", w=3)
        assert indeterminate.status_code == 504, indeterminate.text
        assert indeterminate.json()["error"] == "INDETERMINATE"
        unavailable = client.put("app", key, b"v2", w=3)
        assert unavailable.status_code == 503, unavailable.text
        assert "nothing was sent" in unavailable.json()["detail"]
        ok = client.put("app", key, b"v3")  # W=2 of X and Y; a hint for C on D
        assert ok.status_code == 200, ok.text
        read = client.get("app", key)
        assert unb64u(read.json()["value"]) == b"v3"
        # C never heard from X; it gets v3 from D's hint (D reaches C), not from X.
        replica_c = running.replicators[c]
        eventually(
            lambda: value_of(replica_c.local_value(3, "app", key)) == b"v3",
            what="the hint for C handed over by the fallback",
        )
        assert running.replicators[d].local_value(3, "app", key) is None  # a hint, not data
        eventually(lambda: metric(running.replicators[d], "relay_kv_hints_replayed_total") >= 1)
        assert metric(running.replicators[x], "relay_kv_hints_sent_total") >= 2

        # -- a write C misses entirely, then heal ------------------------------------------
        running.isolate(c)
        missed = client.put("app", key, b"v4")
        assert missed.status_code == 200, missed.text
        time.sleep(1.5)
        assert value_of(replica_c.local_value(3, "app", key)) == b"v3"
        shard = placement.shard_of("app", key)
        diverging = divergence(running)
        first, second = sorted((x, c))
        assert shard in diverging[(first, second, 3)]
        running.isolate(c, cut=False)
        eventually(
            lambda: value_of(replica_c.local_value(3, "app", key)) == b"v4",
            what="C repaired after the heal",
        )
        eventually(lambda: divergence(running) == {}, what="every pair's hashes agree")
        time.sleep(2.5)  # past RELAY_KV__DOWN_S: X tries C again
        again = client.put("app", key, b"v5", w=3)
        assert again.status_code == 200, again.text
        for replica in running.replicators.values():
            if replica.name != d:
                assert value_of(replica.local_value(3, "app", key)) == b"v5"
        assert b64u(b"v5") == client.get("app", key, r=3).json()["value"]
