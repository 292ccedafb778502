"""Broker faults on a three-node Apache Kafka cluster (replication factor 3, min.insync.replicas
2), under the load of `tests.suite.load` with two instances of every service: SIGKILL one broker,
restart it, then SIGKILL the active controller, restart it. Nothing acknowledged is lost, FIFO
holds per queue, nothing is delivered again after an ACK ok; the longest pause in 201s after
each kill is printed (pytest -s) for the issue's note."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests import helpers
from tests.suite import load

pytestmark = pytest.mark.suite

QUEUES = 8
FIRST_KILL_S = 6.0
DOWN_S = 8.0
SETTLE_S = 6.0
RECOVER_S = 12.0  # under load after the controller is back


def active_controller(cluster: helpers.KafkaCluster, alive: list[int]) -> int:
    """The KRaft quorum's leader, as a live node's quorum-state file records it."""
    for node_id in alive:
        node = next(n for n in cluster.nodes if n.node_id == node_id)
        path = node.log_dir / "__cluster_metadata-0" / "quorum-state"
        try:
            leader = int(json.loads(path.read_text())["leaderId"])
        except (OSError, ValueError, KeyError):
            continue
        if leader in alive:
            return leader
    raise AssertionError("no live node knows the active controller")


def test_broker_and_controller_kills_lose_nothing(tmp_path: Path) -> None:
    with helpers.kafka_cluster(tmp_path / "kafka", nodes=3) as cluster:
        args = ["--kafka", cluster.bootstrap, "--port", "0"]
        for option in (
            "--ingress",
            "--queue-writers",
            "--delivery",
            "--retainers",
            "--replicators",
        ):
            args += [option, "2"]
        env = {"RELAY_KAFKA__REPLICATION_FACTOR": "3", "RELAY_KAFKA__MIN_INSYNC_REPLICAS": "2"}
        stalls: dict[str, float] = {}
        killed_at: dict[str, float] = {}
        with helpers.suite(tmp_path, *args, **env) as running:
            assert not [c for c in running.state.children if c.name == "broker"]

            async def kill_and_restart(node_id: int, label: str, record: load.Record) -> None:
                cluster.kill(node_id)
                killed_at[label] = time.monotonic()
                record.kills.append(f"{label} (node {node_id})")
                await asyncio.sleep(DOWN_S)
                await asyncio.to_thread(cluster.start, node_id)

            async def faults(record: load.Record) -> None:
                await asyncio.sleep(FIRST_KILL_S)
                every = [n.node_id for n in cluster.nodes]
                controller = active_controller(cluster, every)
                broker = next(n for n in every if n != controller)
                await kill_and_restart(broker, "broker", record)
                await asyncio.sleep(SETTLE_S)
                controller = active_controller(cluster, every)
                await kill_and_restart(controller, "controller", record)

            record = load.run(running, QUEUES, faults, RECOVER_S)
            for label, when in killed_at.items():
                stalls[label] = load.stall_after(record, when)
    sent = sum(len(q) for q in record.sent.values())
    print(
        f"kills: {record.kills}; longest pause in 201s after each: "
        + ", ".join(f"{label} {s:.2f} s" for label, s in stalls.items())
        + f"; {sent} sends acknowledged"
    )
    assert len(record.kills) == 2
    load.check(record)
