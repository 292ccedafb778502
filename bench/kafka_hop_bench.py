"""The floor of the key-value transport (issue 21): a request through Kafka to a coordinator and
its reply back through Kafka, with nothing of Relay's around it.

    .venv/bin/python bench/kafka_hop_bench.py
        options (defaults): --clients 64 --seconds 10 --warmup 90

Relay's broker (`relayctl up`, the same JVM settings; the suite's services idle beside it)
carries two topics of this run: requests (8 partitions, keyed as `relay.replication`) and
replies (one partition, as one ingress's inbox slot). The asker process runs `--clients` tasks,
each sending a 256-byte request (with Relay's own producer: acks=all, idempotent, linger 0)
and awaiting its reply; a forked coordinator process reads the requests as a group member,
produces one reply per request, and commits its offsets after each batch, as Relay's
coordinator does. No HTTP, no quorum, no store: what is left is what the mandated path
(ingress → Kafka → coordinator → Kafka → ingress) costs at the least. The last line is the JSON
summary: round trips per second and CPU ms per round trip of the broker, the asker and the
coordinator.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import report
import uvloop
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from cpu import cpu_seconds
from kv_bench import ROOT, Relay

from relay_bus import clients
from relay_bus.config import KafkaSettings

PARTITIONS = 8
VALUE = os.urandom(240)


def producer(bootstrap: str) -> AIOKafkaProducer:
    """Relay's own producer (`relay_bus.clients.producer`), so the settings are the same."""
    return clients.producer(KafkaSettings(bootstrap_servers=bootstrap), "kafka-hop-bench")


async def coordinating(bootstrap: str, requests: str) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
    """A coordinator's clients, started: Relay's producer, and a member of the group that reads
    `requests` (committing by hand)."""
    send = producer(bootstrap)
    await send.start()
    read = AIOKafkaConsumer(
        requests,
        bootstrap_servers=bootstrap,
        group_id=f"{requests}-coordinators",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await read.start()
    return send, read


async def coordinate(bootstrap: str, requests: str, replies: str, ready: Any) -> None:
    send, read = await coordinating(bootstrap, requests)
    ready.set()
    while True:
        batches = await read.getmany(timeout_ms=500)
        sent = [
            await send.send(replies, record.value, partition=0)
            for records in batches.values()
            for record in records
        ]
        if sent:
            await asyncio.gather(*sent)
            await read.commit()


def coordinator(bootstrap: str, requests: str, replies: str, ready: Any) -> None:
    uvloop.run(coordinate(bootstrap, requests, replies, ready))


class Asker:
    """Relay's producer and a reader of the reply partition: `ask` sends a request with a fresh
    16-byte id in front and returns the bytes of the reply that starts with that id."""

    def __init__(self, bootstrap: str, replies: str) -> None:
        self.send = producer(bootstrap)
        self.read = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self.replies = replies
        self.waiting: dict[bytes, asyncio.Future[bytes]] = {}
        self.reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.send.start()
        await self.read.start()
        self.read.assign([TopicPartition(self.replies, 0)])
        await self.read.seek_to_end()
        self.reading = asyncio.create_task(self._answers())

    async def ask(self, topic: str, partition: int, payload: bytes) -> bytes:
        request = secrets.token_bytes(16)
        self.waiting[request] = future = asyncio.get_running_loop().create_future()
        await self.send.send(topic, request + payload, partition=partition)
        return await future

    async def stop(self) -> None:
        if self.reading is not None:
            self.reading.cancel()
        await self.send.stop()
        await self.read.stop()

    async def _answers(self) -> None:
        while True:
            for records in (await self.read.getmany(timeout_ms=500)).values():
                for record in records:
                    found = self.waiting.pop(record.value[:16], None)
                    if found is not None and not found.done():
                        found.set_result(record.value[16:])


async def ask(
    bootstrap: str, requests: str, replies: str, options: argparse.Namespace, pids: dict[str, int]
) -> dict[str, Any]:
    asker = Asker(bootstrap, replies)
    await asker.start()
    loop = asyncio.get_running_loop()

    async def client(i: int, until: float) -> int:
        done = 0
        while loop.time() < until:
            await asker.ask(requests, i % PARTITIONS, VALUE)
            done += 1
        return done

    async def load(seconds: float) -> int:
        until = loop.time() + seconds
        return sum(await asyncio.gather(*(client(i, until) for i in range(options.clients))))

    await load(options.warmup)  # unmeasured: the broker's JIT
    before = cpu_seconds(pids)
    began = time.monotonic()
    done = await load(options.seconds)
    elapsed = time.monotonic() - began
    cpu = {name: t - before[name] for name, t in cpu_seconds(pids).items()}
    await asker.stop()
    return {
        "clients": options.clients,
        "round_trips_per_s": round(done / elapsed),
        "cpu_ms_per_round_trip": {n: round(t * 1000 / done, 3) for n, t in cpu.items()},
    }


async def make_topics(bootstrap: str, requests: str, replies: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(requests, PARTITIONS, 1), NewTopic(replies, 1, 1)])
    await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=90)
    options = parser.parse_args()
    (ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOT / "var", prefix="kafka-hop-") as work:
        relay = Relay(Path(work))
        try:
            bootstrap = relay.bootstrap()
            run = secrets.token_hex(3)
            requests, replies = f"hop-asks-{run}", f"hop-answers-{run}"
            asyncio.run(make_topics(bootstrap, requests, replies))
            forked = multiprocessing.get_context("fork")
            ready = forked.Event()
            child = forked.Process(
                target=coordinator, args=(bootstrap, requests, replies, ready), daemon=True
            )
            child.start()
            ready.wait(60)
            pids = {
                "broker": relay.server_pids()["broker"],
                "asker": os.getpid(),
                "coordinator": child.pid or 0,
            }
            summary = uvloop.run(ask(bootstrap, requests, replies, options, pids))
            child.kill()
        finally:
            relay.stop()
    report.emit(summary)


if __name__ == "__main__":
    main()
