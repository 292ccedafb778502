"""The suite's data survives `relayctl up` stopping, or being SIGKILLed with every child, and
starting again on the same data dir: Kafka keeps its topics, records and committed offsets (the
log's epoch is unchanged), and every acknowledged message is still delivered, in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from relay_bus import schemas, topics
from tests.api.client import Recipient
from tests.helpers import BIN, Running, alive, service_env, suite

pytestmark = pytest.mark.suite

QUEUES = 6
MESSAGES = 15
ACKED = 5


def _broker(running: Running) -> str:
    broker = next(c for c in running.state.children if c.name == "broker")
    return f"127.0.0.1:{broker.port}"


def _log_facts(bootstrap: str) -> tuple[str, dict[int, int]]:
    """The epoch at offset 0 of relay.epoch and the queue-writers' committed offsets."""

    async def read() -> tuple[str, dict[int, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            tp = TopicPartition(topics.EPOCH, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            (first,) = (await consumer.getmany(tp, timeout_ms=5000, max_records=1))[tp]
            epoch = schemas.decode(first.value)
            assert isinstance(epoch, schemas.Epoch)
            offsets = await admin.list_consumer_group_offsets("relay.queue-writer")
            committed = {
                tp.partition: meta.offset
                for tp, meta in offsets.items()
                if tp.topic == topics.QUEUE_COMMANDS
            }
            return epoch.epoch, committed
        finally:
            await consumer.stop()
            await admin.close()

    return asyncio.run(read())


def _walk(r: Recipient) -> list[str]:
    """Every message of the queue, acking each (REST head and ack), in delivery order."""
    seen = []
    head = r.call("GET", "/head")
    while head.status_code == 200:
        seen.append(head.json()["msg_id"])
        head = r.call("POST", "/ack", {"msg_id": seen[-1]})
    assert head.status_code == 204, head.text
    return seen


def _kill_everything(running: Running) -> None:
    running.collect_descendants()
    for pid in [running.process.pid, *running.descendants]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    running.process.wait()
    deadline = time.monotonic() + 10
    while [pid for pid in running.descendants if alive(pid)]:
        assert time.monotonic() < deadline
        time.sleep(0.1)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL everything"])
def test_a_restart_on_the_same_data_dir_keeps_every_acknowledged_message(
    tmp_path: Path, stop: str
) -> None:
    port = "0"
    with suite(tmp_path, "--port", port) as running:
        http = httpx.Client(base_url=running.state.ingress_url, timeout=20)
        recipients = [Recipient(http).create() for _ in range(QUEUES)]
        sent = {
            r.queue: [r.send(f"{r.queue}:{n}".encode()).json()["msg_id"] for n in range(MESSAGES)]
            for r in recipients
        }
        for r in recipients:  # the first ACKED of each queue are acknowledged and gone
            for msg_id in sent[r.queue][:ACKED]:
                head = r.call("GET", "/head").json()
                assert head["msg_id"] == msg_id
                assert r.call("POST", "/ack", {"msg_id": msg_id}).status_code == 200
        epoch, committed = _log_facts(_broker(running))
        if stop == "SIGTERM":
            running.process.send_signal(signal.SIGTERM)
            assert running.process.wait(timeout=30) == 0
        else:
            _kill_everything(running)

    with suite(tmp_path, "--port", port) as running:
        after_epoch, after_committed = _log_facts(_broker(running))
        assert after_epoch == epoch  # the same log: nothing was lost and recreated
        assert committed  # the queue-writers had committed offsets ...
        for partition, offset in committed.items():  # ... and kept them
            assert after_committed[partition] >= offset
        http = httpx.Client(base_url=running.state.ingress_url, timeout=20)
        for r in recipients:
            r.http = http
            assert _walk(r) == sent[r.queue][ACKED:]


def test_a_kafka_log_dir_of_another_cluster_is_refused_with_one_line(tmp_path: Path) -> None:
    with suite(tmp_path, "--port", "0") as running:
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0
    data_dir = tmp_path / "var"
    (data_dir / "kafka.cluster-id").write_text("AAAAAAAAAAAAAAAAAAAAAA\n")
    started = time.monotonic()
    result = subprocess.run(
        [str(BIN / "relayctl"), "up", "--data-dir", str(data_dir), "--port", "0"],
        capture_output=True,
        text=True,
        env=service_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "was formatted for Kafka cluster" in lines[0]
    assert "not this data dir's cluster AAAAAAAAAAAAAAAAAAAAAA" in lines[0]
    assert time.monotonic() - started < 30
