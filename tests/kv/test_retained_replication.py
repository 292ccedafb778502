"""Retained messages replicated to the replicators (`RELAY_RETAINED__REPLICATION=quorum`): a
retainer that loses its volume rebuilds its retained store from them, deletes included.

Real processes: Kafka, Redis, the ingress, three replicators and a retainer; the retainer's
data directory is removed while it is stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx

from relay_durable.codec import b64u, unb64u
from relayctl import processes
from tests import helpers
from tests.kv import cluster as kvc
from tests.kv.test_replication import FAST


def test_a_retainer_rebuilds_its_retained_messages_from_the_replicators(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B", "C"), **FAST) as running:
        urls = [r.url for r in running.replicators.values()]
        data = tmp_path / "retainer"
        env = {
            "RELAY_INSTANCE": "retainer-0",
            "RELAY_DATA__DIR": str(data),
            "RELAY_RETAINED__REPLICATION": "quorum",
            "RELAY_RETAINED__REPLICATORS": json.dumps(urls),
        }

        def start() -> processes.Forked:
            port = helpers.free_port()
            process = running.spawn(
                "relay-retainer", {**env, "RELAY_HTTP__PORT": str(port)}, tmp_path / "ret.log"
            )
            running.wait_ready(f"http://127.0.0.1:{port}", process)
            return process

        def stop(process: processes.Forked) -> None:
            process.terminate()
            assert process.wait(20) == 0

        http = httpx.Client(base_url=running.ingress_url, timeout=30)

        def publish(topic: str, payload: bytes) -> int:
            body = {"topic": topic, "payload": b64u(payload), "retain": True}
            return http.post("/v1/publish", json=body).status_code

        retainer = start()
        assert publish("site/door", b"open") == 202
        assert publish("site/light", b"on") == 202
        assert publish("site/light", b"") == 202  # deletes the retained message
        replica = running.replicators["B"]
        stored = replica.local_value(3, "$retained", "site/door")
        assert json.loads(unb64u(stored["x"]))["payload"] == b64u(b"open")
        assert replica.local_value(3, "$retained", "site/light")["x"] is None  # a tombstone
        stop(retainer)

        shutil.rmtree(data)  # the volume is lost
        retainer = start()
        door = http.get("/v1/retained/message", params={"topic": "site/door"})
        assert door.status_code == 200, door.text
        assert unb64u(door.json()["payload"]) == b"open"
        light = http.get("/v1/retained/message", params={"topic": "site/light"})
        assert light.status_code == 404
        stop(retainer)
