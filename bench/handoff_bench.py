"""A queue-writer pool scaled from 1 to 2 with many queues (issue 20: "the time a 1→2 move
takes with 100k queues"; decision 0021).

    .venv/bin/python bench/handoff_bench.py [--queues 100000] [--budget-s 2]

Two real queue-writer processes on the real Apache Kafka broker, as the hand-off test runs
them (`tests/runtime/test_queue_writer_handoff.py`): ordinal 0 serves the 4 partitions,
ordinal 1 owns nothing (the pool just scaled from 1 to 2). First `--queues` queues are made
through Kafka, each created and sent one 256-byte message (the commands put on the command
topic as the ingress puts them, on the queue's partition, every reply read back and checked
201): about a quarter on each partition. Then partitions 2 and 3 move to ordinal 1 one after
the other, as the operator runs a 1 → 2 scale, each while a light load keeps sending to four
queues of it: prefetch (the target pulls the whole partition while the source serves), pause
(the source's fence), catch-up (only the queues changed since the prefetch), commit, release.
Every acknowledged message of the loads is checked on its owner, in order, and every queue
made is held once.

Reported per move: `source_readyz_worst_ms` (`probe.ReadyProbe`: how long the source's event
loop was held while the move ran), `prefetch_s` (a whole copy of the partition: what each
pause would hold without the changes-only catch-up), `pause_ms` (pause call to the commit's
answer) and its steps, what the catch-up carried, and `move_s` (prefetch to release); and
`scale_s`, the two moves together. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
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
from probe import ReadyProbe

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import helpers  # noqa: E402
from tests.runtime import handoff_calls  # noqa: E402
from tests.runtime import test_queue_writer_handoff as handoff  # noqa: E402

from relay_bus import clients, schemas, topics  # noqa: E402
from relay_queues import ids  # noqa: E402

BODY = b"x" * 256
MOVED = (2, 3)
"""The partitions a 1 → 2 scale of 4 partitions gives the new ordinal."""


async def _answered(answered: dict[str, int], count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(answered) < count:
        assert time.monotonic() < deadline, f"{len(answered)} of {count} replies"
        await asyncio.sleep(0.05)


async def fill(kafka: helpers.Kafka, queues: int) -> tuple[float, dict[int, int]]:
    """Create `queues` queues, one message each, through Kafka; seconds taken, and how many
    were made on each partition."""
    settings = kafka.settings()
    origin = f"fill-{uuid.uuid4().hex[:8]}"
    producer = clients.producer(settings, f"{origin}-p")
    consumer = clients.consumer(settings, f"{origin}-c", None)
    await producer.start()
    await consumer.start()
    inbox = TopicPartition(kafka.prefix + topics.INGRESS_INBOX, 0)
    consumer.assign([inbox])
    await consumer.seek_to_end(inbox)
    await consumer.position(inbox)  # resolved before the first command: no reply is missed
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
        per_partition = dict.fromkeys(range(handoff_calls.PARTITIONS), 0)
        while made < queues:
            queue, sender = ids.new_queue_ids(handoff_calls.PARTITIONS)
            partition = ids.partition_of(queue, handoff_calls.PARTITIONS)
            per_partition[partition] += 1
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
        return time.monotonic() - started, per_partition
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
    handoff_calls.CALL_TIMEOUT_S = 1800.0  # a prefetch of a whole partition
    summary: dict[str, Any] = {"queues": args.queues}
    owners = [0] * handoff_calls.PARTITIONS
    tmp = tempfile.mkdtemp(prefix="handoff-bench-", dir=ROOT / "var")
    print(f"logs and data: {tmp} (removed once the run succeeds)", flush=True)
    with helpers.kafka_cluster(Path(tmp) / "kafka") as cluster:
        kafka = helpers.Kafka(cluster)
        with handoff.one_then_two(kafka, Path(tmp)) as (a, b):
            fill_s, per_partition = asyncio.run(fill(kafka, args.queues))
            summary["fill_commands_per_s"] = round(2 * args.queues / fill_s)
            scale_s = 0.0
            for n, partition in enumerate(MOVED):
                load = handoff.Load(kafka)
                load.start(partition)
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
                bodies = handoff.bodies((a, b)[owners[partition]], partition)
                held = {queue: bodies[queue] for queue in acknowledged}
                assert held == acknowledged, "an acknowledged message is not on the owner"
                assert len(bodies) == per_partition[partition] + handoff.LOAD_QUEUES
                summary[f"p{partition}"] = {
                    "source_readyz_worst_ms": probe.worst_ms(),
                    "queues": len(bodies),
                    "committed": moved.committed,
                    "prefetch_s": round(moved.prefetch_s, 2),
                    "pause_ms": round(moved.pause_s * 1000),
                    **{f"step_{step}_ms": round(s * 1000) for step, s in moved.steps_s.items()},
                    "carried_queues": moved.carried["queues"],
                    "carried_whole": moved.carried["whole"],
                    "move_s": round(move_s, 2),
                    "load_sends": len(load.sent),
                }
            summary["scale_s"] = round(scale_s, 2)
    shutil.rmtree(tmp)
    report.emit(summary)


if __name__ == "__main__":
    main()
