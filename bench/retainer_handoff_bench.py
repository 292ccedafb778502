"""A retainer pool scaled from 1 to 2 with many retained topics and stream messages (issue 20,
decision 0022).

    .venv/bin/python bench/retainer_handoff_bench.py [--topics 100000] [--budget-s 2]

Two real retainer processes on the real Apache Kafka broker, as the hand-off test runs them
(`tests/runtime/test_retainer_handoff.py`): ordinal 0 serves the 4 partitions, ordinal 1 owns
nothing. First `--topics` retained topics are published (256-byte payloads) and as many
stream messages stored (one per topic, in batches of 100 per request), through Kafka as the
ingress puts them, every answer read back and checked: about a quarter on each partition.
Then partitions 2 and 3 move to ordinal 1 one after the other, each under a light load of
retained publishes and stream stores: prefetch (a whole copy while the source serves), pause,
catch-up (only the changes since the prefetch), commit, release. Every acknowledged write of
the loads is checked on its owner.

Reported per move: `source_readyz_worst_ms` (the slowest answer of the source's `/readyz`,
asked every 20 ms while the move ran: how long its event loop was held), `writers_held_ms`
(how long the source's prefetch held its writers to settle its copy, from its log),
`prefetch_s`, `pause_ms` (pause call to the commit's answer) and its steps, what the catch-up
carried, `move_s` (prefetch to release); and `scale_s`, the two moves together. The last line
is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import report
from aiokafka import TopicPartition
from probe import ReadyProbe

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import helpers  # noqa: E402
from tests.runtime import handoff_calls  # noqa: E402
from tests.runtime import test_retainer_handoff as handoff  # noqa: E402

from relay_bus import clients, routing, schemas, topics  # noqa: E402
from relay_durable import codec  # noqa: E402

PAYLOAD = codec.b64u(b"x" * 256)
MOVED = (2, 3)
BATCH = 100
"""Stream messages per store request."""


class Filler:
    """Writes put on `relay.publications` as the ingress puts them; their answers by id."""

    def __init__(self, kafka: helpers.Kafka) -> None:
        settings = kafka.settings()
        self.origin = f"fill-{uuid.uuid4().hex[:8]}"
        self.producer = clients.producer(settings, f"{self.origin}-p")
        self.consumer = clients.consumer(settings, f"{self.origin}-c", None)
        self.inbox = TopicPartition(kafka.prefix + topics.INGRESS_INBOX, 0)
        self.publications = kafka.prefix + topics.PUBLICATIONS
        self.answered: dict[str, int] = {}
        self.sent = 0
        self.batches: dict[int, list[schemas.DsMessage]] = {}

    def request(self) -> dict[str, Any]:
        deadline = time.time() * 1000 + 600_000
        return {
            "id": uuid.uuid4().hex,
            "origin": self.origin,
            "reply_slot": 0,
            "deadline_ms": deadline,
        }

    async def read(self) -> None:
        while True:
            for records in (await self.consumer.getmany(timeout_ms=200)).values():
                for raw in records:
                    record = schemas.decode(raw.value)
                    if isinstance(record, schemas.DsReply) and record.origin == self.origin:
                        self.answered[record.id] = record.status

    async def answered_up_to(self, n: int) -> None:
        deadline = time.monotonic() + 600
        while len(self.answered) < n:
            assert time.monotonic() < deadline, f"{len(self.answered)} of {n} answers"
            await asyncio.sleep(0.05)

    async def put(self, record: schemas.Publication | schemas.DsRequest, partition: int) -> None:
        await self.producer.send(self.publications, schemas.encode(record), partition=partition)
        self.sent += 1

    async def publish(self, topic: str, now: int) -> int:
        """A retained publish; its partition."""
        partition = routing.partition_of_topic(topic, handoff_calls.PARTITIONS)
        record = schemas.Publication(
            **self.request(), topic=topic, payload=PAYLOAD, ts=now, retain=True
        )
        await self.put(record, partition)
        return partition

    async def log(self, topic: str, now: int) -> None:
        """A stream message, stored with others of its partition once `BATCH` are waiting."""
        partition = routing.partition_of_topic(topic, handoff_calls.PARTITIONS)
        batch = self.batches.setdefault(partition, [])
        batch.append(schemas.DsMessage(topic=topic, payload=PAYLOAD, ts=now))
        if len(batch) == BATCH:
            await self.store(partition)

    async def store(self, partition: int) -> None:
        messages = tuple(self.batches.pop(partition, []))
        if messages:
            record = schemas.DsRequest(
                **self.request(), op="store", db=handoff.DB, messages=messages
            )
            await self.put(record, partition)


async def fill(kafka: helpers.Kafka, count: int) -> tuple[float, dict[int, int]]:
    """Publish `count` retained topics and store `count` stream messages through Kafka;
    seconds taken, and the retained topics per partition."""
    filler = Filler(kafka)
    await filler.producer.start()
    await filler.consumer.start()
    filler.consumer.assign([filler.inbox])
    await filler.consumer.seek_to_end(filler.inbox)
    await filler.consumer.position(filler.inbox)  # resolved before the first write
    reader = asyncio.create_task(filler.read())
    per_partition = dict.fromkeys(range(handoff_calls.PARTITIONS), 0)
    started = time.monotonic()
    try:
        now = int(time.time() * 1000)
        for n in range(count):
            per_partition[await filler.publish(f"dev/{n}/state", now)] += 1
            await filler.log(f"log/{n}", now)
            if n % 5000 == 4999:
                await filler.producer.flush()
                await filler.answered_up_to(filler.sent - 10_000)
        for partition in list(filler.batches):
            await filler.store(partition)
        await filler.producer.flush()
        await filler.answered_up_to(filler.sent)
        refused = [status for status in filler.answered.values() if status not in (201, 202)]
        assert not refused, f"{len(refused)} writes refused: {refused[:5]}"
        return time.monotonic() - started, per_partition
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await filler.producer.stop()
        await filler.consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--budget-s", type=float, default=2.0)
    args = parser.parse_args()
    handoff_calls.CALL_TIMEOUT_S = 1800.0  # a prefetch of a whole partition
    summary: dict[str, Any] = {"topics": args.topics}
    owners = [0] * handoff_calls.PARTITIONS
    tmp = tempfile.mkdtemp(prefix="retainer-handoff-bench-", dir=ROOT / "var")
    print(f"logs and data: {tmp} (removed once the run succeeds)", flush=True)
    with helpers.kafka_cluster(Path(tmp) / "kafka") as cluster:
        kafka = helpers.Kafka(cluster)
        with handoff.one_then_two(kafka, Path(tmp)) as (a, b):
            fill_s, per_partition = asyncio.run(fill(kafka, args.topics))
            summary["fill_writes_per_s"] = round(2 * args.topics / fill_s)
            scale_s = 0.0
            for n, partition in enumerate(MOVED):
                load = handoff.Load(kafka, partition)
                load.start()
                time.sleep(1.0)
                started = time.monotonic()
                with ReadyProbe(a) as probe:
                    moved = handoff_calls.move(
                        a, b, partition, owners, 2 + 2 * n, budget_s=args.budget_s
                    )
                move_s = time.monotonic() - started
                scale_s += move_s
                time.sleep(0.5)
                acknowledged = load.finish()
                if moved.committed:
                    owners[partition] = 1
                retained, streams = handoff.held((a, b)[owners[partition]], partition)
                differs = load.differences((retained, streams))
                assert not differs, differs
                assert len(retained) == per_partition[partition] + len(acknowledged[0])
                settled = [
                    json.loads(line)["held_ms"]
                    for line in (Path(tmp) / "retainer-0.log").read_text().splitlines()
                    if '"handoff_settled"' in line and f'"partition": {partition},' in line
                ]
                summary[f"p{partition}"] = {
                    "writers_held_ms": settled[-1] if settled else None,
                    "source_readyz_worst_ms": probe.worst_ms(),
                    "retained": len(retained),
                    "stream_messages": sum(map(len, streams.values())),
                    "committed": moved.committed,
                    "prefetch_s": round(moved.prefetch_s, 2),
                    "pause_ms": round(moved.pause_s * 1000),
                    **{f"step_{step}_ms": round(s * 1000) for step, s in moved.steps_s.items()},
                    "carried_whole": moved.carried["whole"],
                    "carried_messages": moved.carried.get("messages"),
                    "move_s": round(move_s, 2),
                    "load_writes": len(load.sent),
                }
            summary["scale_s"] = round(scale_s, 2)
    shutil.rmtree(tmp)
    report.emit(summary)


if __name__ == "__main__":
    main()
