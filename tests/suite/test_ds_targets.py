"""The `/ds` replica-set targets as one quorum-written record per storage on the replicators
(`relay_ds.targets`, namespace `$ds`), read by the ingresses and the retainers.

Real processes: Kafka, Redis, three replicators (A, B, C), two ingresses and two retainers
(each one site, owning half the partitions of `relay.publications`). What a retainer recorded
is read from its own `db.json` (the file it keeps its target in), never from the API, which
shows the record.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_ds import targets
from relay_durable.codec import unb64u
from relay_kv import placement
from relay_retainer.ds_targets import TargetsUnavailable, TargetSync
from relay_retainer.settings import StreamSettings
from relay_retainer.streams import StreamHost
from relay_runtime.readiness import Readiness
from relay_streams import catalog
from relay_streams.store import StreamStore
from tests import helpers
from tests.kv import cluster as kvc
from tests.kv.test_replication import FAST

pytestmark = pytest.mark.suite

PARTITIONS = 8
UNKNOWN = "0000000000000001"


def eventually(check: Callable[[], Any], budget: float = 40, what: str = "") -> Any:
    deadline = time.monotonic() + budget
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {budget} s: {what}")
        time.sleep(0.2)


class Retainer:
    def __init__(self, running: kvc.Cluster, root: Path, k: int) -> None:
        self.running = running
        self.k = k
        self.data = root / f"retainer-{k}"
        self.log = root / f"retainer-{k}.log"
        self.process: subprocess.Popen[str] | None = None

    @property
    def db_json(self) -> Path:
        return self.data / "streams" / "dbs" / "messages" / "db.json"

    def target(self) -> list[str]:
        """The target this retainer recorded for `messages`, from its own file."""
        return list(catalog.DbRecord.load(self.db_json).replicas.target)

    def start(self) -> None:
        port = helpers.free_port()
        urls = [r.url for r in self.running.replicators.values()]
        self.process = self.running.spawn(
            "relay-retainer",
            {
                "RELAY_INSTANCE": f"retainer-{self.k}",
                "RELAY_HTTP__PORT": str(port),
                "RELAY_DATA__DIR": str(self.data),
                "RELAY_DATA__ORDINAL": str(self.k),
                "RELAY_DATA__REPLICAS": "2",
                "RELAY_RETAINED__REPLICATORS": json.dumps(urls),
            },
            self.log,
        )
        self.running.wait_ready(f"http://127.0.0.1:{port}", self.process)

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        assert self.process.wait(20) == 0


def _admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {kvc.TOKEN}"})


def test_targets_are_one_quorum_written_record(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    env = {**FAST, "RELAY_KAFKA__PARTITIONS": str(PARTITIONS)}
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B", "C"), **env) as running:
        retainers = [Retainer(running, tmp_path, k) for k in (0, 1)]
        for retainer in retainers:
            retainer.start()
        port = helpers.free_port()
        other = running.spawn(
            "relay-ingress",
            {
                "RELAY_HTTP__PORT": str(port),
                "RELAY_INSTANCE": "ingress-other",
                "RELAY_REDIS_URL": redis_url,
            },
            tmp_path / "ingress-other.log",
        )
        try:
            running.wait_ready(f"http://127.0.0.1:{port}", other)
            _scenario(
                running,
                retainers,
                _admin(running.ingress_url),
                _admin(f"http://127.0.0.1:{port}"),
                tmp_path / "in-process",
            )
        finally:
            other.terminate()
            other.wait(20)
            for retainer in retainers:
                if retainer.process is not None and retainer.process.poll() is None:
                    retainer.stop()


def _record(replica: kvc.Replicator) -> targets.TargetRecord | None:
    stored = replica.local_value(3, targets.NAMESPACE, "messages")
    return None if stored is None else targets.decode(unb64u(stored["x"]))


def _sync(running: kvc.Cluster, root: Path, urls: list[str] | None = None) -> Any:
    """One read of the records by a retainer's `TargetSync` on a store of its own under `root`
    (in this process, real files): (the databases with a record, the store's target of
    `messages`, the sites its registry knows), or the exception the read raised."""

    async def run() -> Any:
        host = StreamHost(root, "in-process", StreamSettings(), Readiness())
        await host.open()
        wanted = [r.url for r in running.replicators.values()] if urls is None else urls
        sync = TargetSync(host, wanted, kvc.TOKEN, "in-process", 5.0)
        try:
            read = await sync.read(None)
            async with sync.lock:
                recorded = await sync.apply(read)
            return recorded, host.store.replicas("messages"), set(host.store.registry.sites)
        except TargetsUnavailable as error:
            return error
        finally:
            await sync.close()
            await host.close()

    return asyncio.run(run())


def _scenario(
    running: kvc.Cluster,
    retainers: list[Retainer],
    first: httpx.Client,
    second: httpx.Client,
    own: Path,
) -> None:
    info = eventually(
        lambda: (r := first.get("/ds/info")).status_code == 200 and r.json(), what="/ds/info"
    )
    a, b = [r["site"] for r in info["retainers"]]
    replicas = "/ds/storages/messages/replicas"

    # Before any write (the migration): each retainer's own target, their union shown; a
    # store reading the records finds none and keeps its own target.
    assert first.get(replicas).json() == sorted([a, b])
    assert [r.target() for r in retainers] == [[a], [b]]
    recorded, target, _ = _sync(running, own)
    assert recorded == set()
    assert len(target) == 1
    assert target[0] not in (a, b)

    # Bad input: a 4xx with a code, and nothing written anywhere.
    before = first.get("/ds/storages/messages").json()
    for response, status in [
        (first.put(replicas, json=[]), 400),
        (first.put(replicas, json=[a, UNKNOWN]), 400),
        (first.put(replicas, json=[a, a]), 400),
        (first.put(replicas, json=["not-a-site"]), 400),
        (first.put(replicas, json={"sites": [a]}), 400),
        (first.put(f"{replicas}/{UNKNOWN}"), 400),
        (first.put("/ds/storages/nosuchdb/replicas", json=[a]), 404),
    ]:
        assert response.status_code == status, response.text
        assert response.json()["error"] in {"BAD_REQUEST", "NOT_FOUND"}
    assert all(_record(r) is None for r in running.replicators.values())
    assert first.get("/ds/storages/messages").json() == before
    assert [r.target() for r in retainers] == [[a], [b]]

    # A write through one ingress, read through the other; on a majority; at both retainers.
    ok = first.put(replicas, json=[a, b])
    assert (ok.status_code, ok.json()) == (202, "OK")
    assert second.get(replicas).json() == sorted([a, b])
    shards = second.get("/ds/storages/messages").json()["shards"]
    assert shards[0]["transitions"] == [{"site": b, "transition": "joining"}]
    assert shards[-1]["transitions"] == [{"site": a, "transition": "joining"}]
    written = [_record(r) for r in running.replicators.values()]
    assert sum(r is not None and r.replicas == [a, b] for r in written) >= 2
    assert [r.target() for r in retainers] == [[a, b], [a, b]]
    recorded, target, known = _sync(running, own)  # the same store, now with a record to take
    assert (recorded, target) == ({"messages"}, [a, b])
    assert {a, b} <= known
    unread = _sync(running, own, [f"http://127.0.0.1:{helpers.free_port()}"])
    assert isinstance(unread, TargetsUnavailable)

    # One replicator of three killed (not the one coordinating the key): W=2 of 3 still
    # answers, and a later write wins.
    held = running.wait_for_partitions()
    coordinating = placement.shard_of(targets.NAMESPACE, "messages") % PARTITIONS
    victim = next(name for name, ps in held.items() if coordinating not in ps)
    running.kill(victim)
    later = second.put(replicas, json=[b, a])
    assert (later.status_code, later.json()) == (202, "OK"), later.text
    alive = [r for name, r in running.replicators.items() if name != victim]
    assert all(
        _record(r) == targets.TargetRecord([b, a], {a: "retainer-0", b: "retainer-1"})
        for r in alive
    )
    assert [r.target() for r in retainers] == [[b, a], [b, a]]
    assert first.get(replicas).json() == sorted([a, b])

    # A retainer that missed a change (its file changed while it was stopped) reads the record
    # again at its start.
    retainers[1].stop()
    store = StreamStore(retainers[1].data / "streams", node="retainer-1")
    store.set_replicas("messages", [b])
    store.close()
    assert retainers[1].target() == [b]
    retainers[1].start()
    eventually(lambda: retainers[1].target() == [b, a], what="retainer 1 reads its target")

    # A retainer that lost its volume: a new site, which gets the target back, with the
    # target's sites registered from the record.
    retainers[0].stop()
    shutil.rmtree(retainers[0].data)
    retainers[0].start()
    eventually(
        lambda: retainers[0].db_json.exists() and retainers[0].target() == [b, a],
        what="retainer 0 gets its target back",
    )
    fresh = first.get("/ds/info").json()["retainers"][0]["site"]
    assert fresh not in (a, b)
    known = json.loads((retainers[0].data / "streams" / "sites.json").read_text())["sites"]
    assert known[a] == {"node": "retainer-0"}
    assert known[b] == {"node": "retainer-1"}
    shard0 = first.get("/ds/storages/messages").json()["shards"][0]
    assert shard0["replicas"] == [{"site": fresh, "status": "up"}]
    assert shard0["transitions"] == [
        {"site": b, "transition": "joining"},
        {"site": a, "transition": "joining"},
        {"site": fresh, "transition": "leaving"},
    ]
