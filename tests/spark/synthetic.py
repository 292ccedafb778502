"""A synthetic archive, as the archiver would write it from a busy suite: queues created, sent
to, acknowledged, suspended and deleted across partitions, each command with its reply on the
inbox (some commands unanswered), and retained publications. Used by the Spark tests and by
`bench/archive_bench.py`; deterministic for a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from relay_archive import layout, rows, writer
from relay_archive.store import ArchiveStore
from relay_bus import routing, schemas, topics
from relay_queues import ids

COMMON = {"origin": "o", "reply_slot": 0, "deadline_ms": 10**13}
EPOCH = "e0"


@dataclass
class Made:
    """What was written, for the tests to check against."""

    commands: dict[int, int] = field(default_factory=dict)
    """Partition → the next offset (the cut covering everything)."""
    unanswered: list[str] = field(default_factory=list)
    files: list[layout.ArchiveFile] = field(default_factory=list)


def make(
    store: ArchiveStore,
    *,
    commands: int,
    partitions: int = 4,
    seed: int = 1,
    per_file: int = 5_000,
    unanswered_every: int = 0,
    retained: int = 0,
    streams: int = 0,
) -> Made:
    rnd = random.Random(seed)
    made = Made()
    logs: dict[tuple[str, int], list[tuple[bytes, int]]] = {}
    queues: list[tuple[str, str, list[str]]] = []  # queue, sender, messages in order
    ts = 1_700_000_000_000

    def put(topic: str, partition: int, value: bytes, at: int) -> None:
        logs.setdefault((topic, partition), []).append((value, at))

    def reply(
        cid: str, status: int, data: dict[str, object] | None, code: str | None = None
    ) -> None:
        record = schemas.QueueReply(id=cid, origin="o", status=status, data=data, code=code)
        put(topics.INGRESS_INBOX, rnd.randrange(partitions), schemas.encode(record), ts)

    for n in range(commands):
        ts += rnd.randrange(1, 50)
        cid = f"c{n}"
        answered = not unanswered_every or n % unanswered_every != unanswered_every - 1
        choice = rnd.random()
        if not queues or choice < 0.1:
            queue = ids.new_id()
            partition = ids.partition_of(queue, partitions)
            while True:
                sender = ids.new_id()
                if ids.partition_of(sender, partitions) == partition:
                    break
            command: schemas.QueueCommand = schemas.CreateQueue(
                id=cid, **COMMON, queue=queue, sender=sender, recipient_key="k" * 43
            )
            queues.append((queue, sender, []))
            status, data = 201, {"recipient_id": queue, "sender_id": sender, "quota": 128}
        else:
            queue, sender, messages = queues[rnd.randrange(len(queues))]
            partition = ids.partition_of(queue, partitions)
            signed = {"queue": queue, "signed": "x", "sig": "eA"}
            if choice < 0.7 or not messages:
                msg_id = ids.new_id()
                body = ids.b64u(rnd.randbytes(rnd.randrange(16, 200)))
                command = schemas.SendMessage(
                    id=cid, **COMMON, sender=sender, msg_id=msg_id, body=body
                )
                status, data = 201, {"msg_id": msg_id, "ts": ts}
                if answered:
                    messages.append(msg_id)
            elif choice < 0.97:
                command = schemas.AckMessage(id=cid, **COMMON, msg_id=messages[0], **signed)
                status, data = 200, {}
                if answered:
                    messages.pop(0)
            else:
                command = schemas.SuspendQueue(id=cid, **COMMON, **signed)
                status, data = 200, {}
        put(topics.QUEUE_COMMANDS, partition, schemas.encode(command), ts)
        if answered:
            reply(cid, status, data)
        else:
            made.unanswered.append(cid)
    for n in range(retained):
        topic = f"dev/{n % max(1, retained // 2)}/state"
        rid = f"r{n}"
        publication = schemas.Publication(
            id=rid, **COMMON, topic=topic, payload=ids.b64u(b"%d" % n), ts=ts + n, retain=True
        )
        put(
            topics.PUBLICATIONS,
            routing.partition_of_topic(topic, partitions),
            schemas.encode(publication),
            ts,
        )
        answer = schemas.DsReply(
            id=rid, origin="o", partition=0, instance="r", site="s", status=202
        )
        put(topics.INGRESS_INBOX, 0, schemas.encode(answer), ts)
    for n in range(streams):  # durable-stream writes of two messages each
        sid = f"s{n}"
        # One topic in five starts with `$`: a subscription's `#` does not match it (MQTT), an
        # export must still hold it.
        topic = "$ops/log" if n % 5 == 4 else f"log/{n % 5}"
        messages = tuple(
            schemas.DsMessage(topic=topic, payload=ids.b64u(b"%d.%d" % (n, i)), ts=ts + n)
            for i in range(2)
        )
        write = schemas.DsRequest(id=sid, **COMMON, op="store", db="messages", messages=messages)
        put(
            topics.PUBLICATIONS,
            routing.partition_of_topic(topic, partitions),
            schemas.encode(write),
            ts,
        )
        if unanswered_every and n % unanswered_every == unanswered_every - 1:
            made.unanswered.append(sid)
            continue
        answer = schemas.DsReply(
            id=sid, origin="o", partition=0, instance="r", site="s", status=201
        )
        put(topics.INGRESS_INBOX, 0, schemas.encode(answer), ts)
    for (topic, partition), records in sorted(logs.items()):
        slot = layout.Slot(EPOCH, topic, partition)
        for start in range(0, len(records), per_file):
            chunk = records[start : start + per_file]
            f = layout.ArchiveFile(slot, start, start + len(chunk) - 1)
            kept = [rows.row_of(start + i, at, None, value) for i, (value, at) in enumerate(chunk)]
            writer.write(store, f, kept)
            made.files.append(f)
        if topic == topics.QUEUE_COMMANDS:
            made.commands[partition] = len(records)
    return made
