"""A command consumed twice has no second effect (BRIEF §4, issue 6): a queue-writer killed
and restarted with its Kafka-committed offsets reset to 0, so Kafka would hand it every
command again, applies none of them twice (it resumes from the marks in its journal)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from relay_bus import topics
from tests.api.client import Recipient
from tests.helpers import BIN, Kafka, free_port, running_service, service_env

PARTITIONS = 4


def _start_writer(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "relay-queue-writer")],
        env=service_env(RELAY_HTTP__PORT=str(port), **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise TimeoutError("queue-writer not ready")


def _rewind_group(kafka: Kafka) -> None:
    async def rewind() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id=kafka.prefix + "relay.queue-writer",
            enable_auto_commit=False,
        )
        await consumer.start()
        tps = [TopicPartition(kafka.prefix + topics.QUEUE_COMMANDS, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.commit({tp: OffsetAndMetadata(0, "") for tp in tps})
        await consumer.stop()

    asyncio.run(rewind())


def test_commands_consumed_again_change_nothing(
    kafka: Kafka, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **kafka.env(),
        "RELAY_KAFKA__PARTITIONS": str(PARTITIONS),
        "RELAY_REDIS_URL": redis_url,
    }
    writer_env = {**env, "RELAY_DATA__DIR": str(tmp_path)}
    writer, _ = _start_writer(writer_env)
    try:
        with (
            running_service("relay-ingress", **env) as ingress,
            httpx.Client(base_url=ingress, timeout=20) as http,
        ):
            r = Recipient(http).create()
            sent = [r.send(f"m{i}".encode()).json()["msg_id"] for i in range(3)]
            assert r.call("GET").json()["size"] == 3
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait()
            _rewind_group(kafka)
            writer, _ = _start_writer(writer_env)
            assert r.send(b"after").status_code == 201  # served, so the backlog was read
            assert r.call("GET").json()["size"] == 4
            head = r.call("GET", "/head").json()
            assert head["msg_id"] == sent[0]
            for msg_id in sent[1:]:
                assert r.call("POST", "/ack", {"msg_id": head["msg_id"]}).json()["msg_id"] == msg_id
                head = {"msg_id": msg_id}
    finally:
        writer.kill()
        writer.wait()
