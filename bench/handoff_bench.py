"""A queue-writer partition move with many queues (issue 20: "the time a 1→2 move takes with
100k queues"; decision 0021).

    .venv/bin/python bench/handoff_bench.py [--queues 100000] [--budget-s 2]

Two real queue-writer processes on the real Apache Kafka broker, as the hand-off test runs
them (`tests/runtime/test_queue_writer_handoff.py`): ordinal 0 serves every partition, ordinal 1
owns nothing (a pool just scaled from 1 to 2). Partition 1 is filled through Kafka with
`--queues` queues, each created and sent one 256-byte message (the commands put on the command
topic as the ingress puts them, every reply read back and checked 201). Then, while a light
load keeps sending to four queues of that partition, the move is run as the operator runs it:
prefetch (the target pulls the whole partition while the source serves), pause (the source's
fence), catch-up (only the queues changed since the prefetch), commit, release. Every
acknowledged message of the load is checked on the target, in order.

Reported: the fill rate, `prefetch_s` (a whole copy of the partition: what each pause would
hold without the changes-only catch-up), `pause_ms` and its steps, what the catch-up carried,
and `move_s` (prefetch to release). The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import report
from aiokafka import TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import helpers  # noqa: E402
from tests.runtime import test_queue_writer_handoff as handoff  # noqa: E402

from relay_bus import clients, schemas, topics  # noqa: E402
from relay_queues import ids  # noqa: E402

BODY = b"x" * 256


async def _answered(answered: dict[str, int], count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(answered) < count:
        assert time.monotonic() < deadline, f"{len(answered)} of {count} replies"
        await asyncio.sleep(0.05)


async def fill(kafka: helpers.Kafka, partition: int, queues: int) -> float:
    """Create `queues` queues on `partition`, one message each, through Kafka; seconds taken."""
    settings = kafka.settings()
    origin = f"fill-{uuid.uuid4().hex[:8]}"
    producer = clients.producer(settings, f"{origin}-p")
    consumer = clients.consumer(settings, f"{origin}-c", None)
    await producer.start()
    await consumer.start()
    consumer.assign([TopicPartition(kafka.prefix + topics.INGRESS_INBOX, 0)])
    commands = kafka.prefix + topics.QUEUE_COMMANDS
    key = ids.b64u(
        Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    started = time.monotonic()
    answered: dict[str, int] = {}

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for raw in records:
                    record = schemas.decode(raw.value)
                    if isinstance(record, schemas.QueueReply) and record.origin == origin:
                        answered[record.id] = record.status

    def request() -> dict[str, Any]:
        deadline = time.time() * 1000 + 600_000
        return {"id": uuid.uuid4().hex, "origin": origin, "reply_slot": 0, "deadline_ms": deadline}

    reader = asyncio.create_task(read())
    try:
        made = 0
        while made < queues:
            queue, sender = ids.new_queue_ids(handoff.PARTITIONS)
            if ids.partition_of(queue, handoff.PARTITIONS) != partition:
                continue
            create = schemas.CreateQueue(**request(), queue=queue, sender=sender, recipient_key=key)
            send = schemas.SendMessage(
                **request(), sender=sender, msg_id=ids.new_id(), body=ids.b64u(BODY)
            )
            for command in (create, send):
                await producer.send(commands, schemas.encode(command), partition=partition)
            made += 1
            if made % 5000 == 0:
                await producer.flush()
                await _answered(answered, 2 * made - 20_000, 600)  # at most ~10k queues ahead
        await producer.flush()
        await _answered(answered, 2 * queues, 600)
        refused = [status for status in answered.values() if status != 201]
        assert not refused, f"{len(refused)} commands refused: {refused[:5]}"
        return time.monotonic() - started
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await producer.stop()
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--budget-s", type=float, default=2.0)
    args = parser.parse_args()
    partition = handoff.MOVED
    handoff.CALL_TIMEOUT_S = 1800.0  # a prefetch of the whole partition
    with (
        tempfile.TemporaryDirectory(prefix="handoff-bench-", dir=ROOT / "var") as tmp,
        helpers.kafka_cluster(Path(tmp) / "kafka") as cluster,
    ):
        kafka = helpers.Kafka(cluster)
        with handoff.one_then_two(kafka, Path(tmp)) as (a, b):
            fill_s = asyncio.run(fill(kafka, partition, args.queues))
            load = handoff.Load(kafka)
            load.start(partition)
            time.sleep(1.0)
            started = time.monotonic()
            moved = handoff.move(a, b, partition, [0, 0, 0, 0], 2, budget_s=args.budget_s)
            move_s = time.monotonic() - started
            time.sleep(0.5)
            acknowledged = load.finish()
            bodies = handoff.bodies(b if moved.committed else a, partition)
            held = {queue: bodies[queue] for queue in acknowledged}
            assert held == acknowledged, "an acknowledged message is not on the owner"
            assert len(bodies) == args.queues + handoff.LOAD_QUEUES
    report.emit(
        {
            "queues": args.queues,
            "fill_s": round(fill_s, 1),
            "fill_commands_per_s": round(2 * args.queues / fill_s),
            "committed": moved.committed,
            "prefetch_s": round(moved.prefetch_s, 2),
            "pause_ms": round(moved.pause_s * 1000),
            **{f"{step}_ms": round(s * 1000) for step, s in moved.steps_s.items()},
            "carried_queues": moved.carried["queues"],
            "carried_whole": moved.carried["whole"],
            "move_s": round(move_s, 2),
            "load_sends": len(load.sent),
        }
    )


if __name__ == "__main__":
    main()
