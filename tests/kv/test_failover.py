"""A coordinating replicator killed with a write in hand: the ingress sends the request again
(`RELAY_KV_RESEND_S`), the replicator that takes its partition over runs it, and the client
gets 200 instead of waiting out its timeout for a 504. Real processes: Kafka, three
replicators, an ingress; the dying coordinator is held mid-quorum by cutting its links."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from relay_durable.codec import unb64u
from relay_kv import placement
from tests import helpers
from tests.kv import cluster as kvc
from tests.kv.test_replication import FAST, PARTITIONS


def run(tmp_path: Path, kafka: helpers.Kafka, redis_url: str, **env: str) -> tuple[int, str]:
    """Kill the coordinator of a write while it waits on its cut links; the write's answer."""
    slow = {**FAST, "RELAY_KV__REPLICA_TIMEOUT_S": "30", "RELAY_REQUEST_TIMEOUT_S": "25", **env}
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B", "C"), **slow) as running:
        client = kvc.Client(running.ingress_url)
        made = client.namespace("app", n=3, r=2, w=2)
        assert made.status_code == 200, made.text
        client.token = made.json()["token"]
        held = running.wait_for_partitions()
        key = "held-by-the-dying"
        x = next(
            n for n, parts in held.items() if placement.shard_of("app", key) % PARTITIONS in parts
        )
        running.isolate(x)  # x reads the write and waits on replicas it cannot reach
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.put, "app", key, b"kept")
            time.sleep(2)
            running.kill(x)
            found = answer.result()
        running.isolate(x, cut=False)
        if found.status_code == 200:
            got = client.get("app", key)
            assert got.status_code == 200, got.text
            assert unb64u(got.json()["value"]) == b"kept"
        return found.status_code, found.text


def test_a_write_whose_coordinator_dies_is_sent_again_and_applied(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    status, text = run(tmp_path, kafka, redis_url)
    assert status == 200, text


def test_without_sending_again_the_same_write_is_indeterminate(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    """The control: the request the dead coordinator had read is lost with it."""
    status, text = run(tmp_path, kafka, redis_url, RELAY_KV_RESEND_S="60")
    assert status == 504, text


def test_a_killed_coordinators_partitions_go_to_the_others_before_its_session_ends(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    """Its peers find its address refusing connections and remove it from the consumer group
    (`Bus.remove_static_member`): a write on one of its partitions is answered by another
    replicator within seconds, where its 30 s session would hold the partition to its end."""
    env = {**FAST, "RELAY_KAFKA__SESSION_TIMEOUT_MS": "30000"}
    names = ("A", "B", "C")
    running = kvc.Cluster(tmp_path, kafka, redis_url, names=names, env=env, direct=True)
    try:
        running.start()
        client = kvc.Client(running.ingress_url)
        made = client.namespace("app", n=3, r=2, w=2)
        assert made.status_code == 200, made.text
        client.token = made.json()["token"]
        theirs = set(running.wait_for_partitions()["A"])
        keys = [f"key-{i}" for i in range(1000)]
        on_a = next(k for k in keys if placement.shard_of("app", k) % PARTITIONS in theirs)
        elsewhere = next(k for k in keys if placement.shard_of("app", k) % PARTITIONS not in theirs)
        running.kill("A")
        killed = time.monotonic()
        # A live coordinator's write reaches A as a replica, which refuses the connection.
        assert client.put("app", elsewhere, b"seen").status_code == 200
        found = client.put("app", on_a, b"kept")
        assert found.status_code == 200, found.text
        assert time.monotonic() - killed < 10
        held = [
            p
            for n in names[1:]
            for p in running.replicators[n].get("/internal/kv/status")["partitions"]
        ]
        assert sorted(held) == list(range(PARTITIONS))
    finally:
        running.stop()
