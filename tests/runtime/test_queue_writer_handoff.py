"""Hand-off of one queue-writer partition between real processes (decision 0019, "Hand-off of a
queue-writer partition"): two queue-writers on the real Apache Kafka broker, started as their
console script, a light load of SEND commands put on the moved partition's command topic as
the ingress puts them, and their replies read back from the ingress inbox.

`move` below plays the operator's part (the operator does not drive moves yet): prefetch (the
target pulls and imports the source's export while the source serves), pause (the source
installs the new generation, its fence, and answers its digest), catch-up (the target pulls
the export made after the fence; digests compared), commit (the target installs the
generation and serves from the imported mark) and release (the source forgets its copy; its
keeping time is 0 here). A pause past its budget, or
digests that differ, roll back: a newer generation giving the partition back to the source,
and the target forgets what it imported."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_bus import schemas, topics
from relay_queues import ids
from relay_queues import partition_state as ps
from tests import helpers
from tests.runtime import handoff_calls
from tests.runtime.handoff_calls import (
    AUTH,
    PARTITIONS,
    call,
    digest,
    export,
    import_,
    move,
    ok,
    serving,
)
from tests.runtime.inbox_load import InboxLoad

MOVED = 1
SEND_INTERVAL_S = 0.02
LOAD_QUEUES = 4
PER_QUEUE = 120


def one_then_two(kafka: helpers.Kafka, root: Path) -> AbstractContextManager[tuple[str, str]]:
    """`handoff_calls.one_then_two` of relay-queue-writers."""
    return handoff_calls.one_then_two("relay-queue-writer", kafka, root)


@dataclass
class Load(InboxLoad):
    """SEND commands for `LOAD_QUEUES` queues on one partition, in turn, one every
    `interval_s` until stopped (or `per_queue` sends each: below the quota of 128
    messages a queue), each with its own body (its rank); replies read from the inbox by id."""

    interval_s: float = SEND_INTERVAL_S
    per_queue: int = PER_QUEUE
    partition: int = 0
    queues: list[tuple[str, str]] = field(default_factory=list)
    """(recipient id, sender id) of each queue."""
    sent: list[tuple[str, str, str]] = field(default_factory=list)
    """(command id, queue, body) in the order put on Kafka."""
    created: threading.Event = field(default_factory=threading.Event)

    def start(self, partition: int) -> None:
        self.partition = partition
        while len(self.queues) < LOAD_QUEUES:
            queue, sender = ids.new_queue_ids(PARTITIONS)
            if ids.partition_of(queue, PARTITIONS) == partition:
                self.queues.append((queue, sender))
        self.run_in_thread()
        assert self.created.wait(60), self.error

    def is_reply(self, record: object) -> bool:
        return isinstance(record, schemas.QueueReply)

    async def produce(self, producer: Any) -> None:
        commands = self.topic(topics.QUEUE_COMMANDS)
        key = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        for queue, sender in self.queues:
            create = schemas.CreateQueue(
                **self.request(), queue=queue, sender=sender, recipient_key=ids.b64u(key)
            )
            await producer.send_and_wait(commands, schemas.encode(create), partition=self.partition)
            await self.answered([create.id])
            assert self.replies[create.id].status == 201, self.replies[create.id]
        self.created.set()
        rank = 0
        while not self.stop.is_set() and rank < LOAD_QUEUES * self.per_queue:
            queue, sender = self.queues[rank % LOAD_QUEUES]
            body = f"m{rank:06d}"
            send = schemas.SendMessage(
                **self.request(), sender=sender, msg_id=ids.new_id(), body=ids.b64u(body.encode())
            )
            await producer.send_and_wait(commands, schemas.encode(send), partition=self.partition)
            self.sent.append((send.id, queue, body))
            rank += 1
            await asyncio.sleep(self.interval_s)
        await self.answered([i for i, _, _ in self.sent])

    def finish(self) -> dict[str, list[str]]:
        """Stop sending, wait for every reply; each queue's bodies acknowledged (201), in
        send order."""
        self.stop.set()
        assert self.done.wait(90)
        assert self.error is None, repr(self.error)
        acknowledged: dict[str, list[str]] = {queue: [] for queue, _ in self.queues}
        for i, queue, body in self.sent:
            if self.replies[i].status == 201:
                acknowledged[queue].append(body)
        return acknowledged

    def still_sending(self) -> bool:
        return not self.done.is_set()


def bodies(url: str, partition: int) -> dict[str, list[str]]:
    """Each queue's message bodies on the partition at `url`, in order."""
    state = ps.from_json(export(url, partition))
    return {q.record.recipient_id: [m.body.decode() for m in q.messages] for q in state.queues}


def test_a_partition_moves_from_one_instance_to_two_under_load(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        assert serving(a, b) == [[0, 1, 2, 3], []]
        load = Load(kafka)
        load.start(MOVED)
        time.sleep(1.0)
        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2)
        assert load.still_sending()  # the move happened under the load
        steps = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in moved.steps_s.items())
        print(
            f"\nmove 1->2 of partition {MOVED}: pause {moved.pause_s * 1000:.0f} ms ({steps}), "
            f"prefetch {moved.prefetch_s * 1000:.0f} ms, {len(load.sent)} sends so far"
        )
        assert moved.committed, moved
        assert moved.source_digest == moved.target_digest
        # The catch-up carried only the queues the load changed since the prefetch.
        assert moved.carried["whole"] is False, moved.carried
        assert moved.carried["queues"] <= LOAD_QUEUES, moved.carried
        time.sleep(1.0)
        acknowledged = load.finish()

        assert serving(a, b) == [[0, 2, 3], [1]]
        assert sum(map(len, acknowledged.values())) == len(load.sent) > 20  # every one 201
        # The target's digest, from its watch through the commands it served since the
        # commit, is a whole collection's.
        assert digest(b, MOVED) == export(b, MOVED)["digest"]
        # Every acknowledged message is on the target, in the order sent, and nothing else.
        assert bodies(b, MOVED) == acknowledged
        # The source forgot its copy (release): the empty partition's digest.
        assert digest(a, MOVED) == ps.digest(ps.empty(MOVED, PARTITIONS))


def test_a_catch_up_over_a_state_not_the_prefetched_one_pulls_the_whole_partition(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """The changes since the prefetch, installed over anything else (here a state with a queue
    the source never held, put back under the prefetch's name), do not give the source's
    digest: the target pulls the whole partition, and the move commits with equal digests,
    losing nothing."""
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka)
        load.start(MOVED)
        time.sleep(0.5)

        def put_back_another_state() -> None:
            held = ps.from_json(export(a, MOVED))  # the source's watch, as a prefetch leaves it
            assert isinstance(held, ps.PartitionState)
            while True:
                queue, sender = ids.new_queue_ids(PARTITIONS)
                if ids.partition_of(queue, PARTITIONS) == MOVED:
                    break
            record = held.queues[0].record._replace(recipient_id=queue, sender_id=sender)
            other = ps.PartitionState(
                MOVED, PARTITIONS, held.mark, (*held.queues, ps.QueueState(record, False, ()))
            )
            import_(b, {**ps.to_json(other), "since": export(a, MOVED)["since"]})

        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2, after_prefetch=put_back_another_state)
        assert moved.committed, moved
        assert moved.source_digest == moved.target_digest
        assert moved.carried["whole"] is True, moved.carried
        assert moved.carried["differed"] is not None, moved.carried  # the changes came first
        acknowledged = load.finish()
        assert sum(map(len, acknowledged.values())) == len(load.sent) > 10
        assert bodies(b, MOVED) == acknowledged


def test_a_pause_past_its_budget_rolls_back_and_the_source_serves_again(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka)
        load.start(MOVED)
        time.sleep(0.5)
        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2, budget_s=0.0)
        assert load.still_sending()
        print(f"\nrolled back move of partition {MOVED}: pause {moved.pause_s * 1000:.0f} ms")
        assert not moved.committed
        time.sleep(1.0)
        acknowledged = load.finish()

        assert serving(a, b) == [[0, 1, 2, 3], []]
        assert ok(call("GET", f"{b}/internal/ownership"))["generation"] == 3
        assert sum(map(len, acknowledged.values())) == len(load.sent) > 10
        assert bodies(a, MOVED) == acknowledged
        assert digest(b, MOVED) == ps.digest(ps.empty(MOVED, PARTITIONS))


def test_bad_hand_off_requests_are_refused_and_change_nothing(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka)
        load.start(MOVED)
        load.finish()
        good = export(a, MOVED)
        before = (digest(a, MOVED), digest(b, MOVED), serving(a, b))
        assert before[0] != before[1]
        url = f"{b}/internal/partitions/{MOVED}"
        dead = f"http://127.0.0.1:{helpers.free_port()}"
        stay = {
            "generation": 2,
            "partitions": PARTITIONS,
            "replicas": 2,
            "assignment": [0, 0, 1, 0],
        }
        cases = [
            (
                call("PUT", f"{b}/internal/partitions/{PARTITIONS}/import", good),
                400,
                "BAD_PARTITION",
            ),
            (call("GET", f"{b}/internal/partitions/x/state"), 400, "BAD_PARTITION"),
            (httpx.put(f"{url}/import", content=b"{", headers=AUTH), 400, "BAD_JSON"),
            (call("PUT", f"{url}/import", {**good, "digest": "0" * 64}), 400, "BAD_STATE"),
            (call("PUT", f"{url}/import", {**good, "mark": 5}), 400, "BAD_STATE"),
            (call("PUT", f"{b}/internal/partitions/2/import", good), 400, "PARTITION_MISMATCH"),
            # a serves the partition: an import or a delete there would lose its commands
            (
                call("PUT", f"{a}/internal/partitions/{MOVED}/import", good),
                409,
                "PARTITION_SERVED",
            ),
            (call("DELETE", f"{a}/internal/partitions/{MOVED}"), 409, "PARTITION_SERVED"),
            (httpx.put(f"{url}/import", json=good), 403, "FORBIDDEN"),
            (httpx.get(f"{url}/export", headers={"authorization": "Bearer no"}), 403, "FORBIDDEN"),
            (httpx.delete(url), 403, "FORBIDDEN"),
            (call("POST", f"{url}/prefetch", {"source": "nowhere"}), 400, "BAD_SOURCE"),
            (call("POST", f"{url}/prefetch", {"source": dead}), 502, "SOURCE_UNAVAILABLE"),
            # a still serves it: no catch-up from it, and no pull into it
            (call("POST", f"{url}/catch-up", {"source": a}), 409, "SOURCE_SERVING"),
            (
                call("POST", f"{a}/internal/partitions/{MOVED}/prefetch", {"source": b}),
                409,
                "PARTITION_SERVED",
            ),
            # changes are carried by a catch-up, never imported
            (
                call("PUT", f"{url}/import", {**good, "changes": True, "deleted": []}),
                400,
                "BAD_STATE",
            ),
            # a pause must take the partition from the instance paused
            (call("POST", f"{a}/internal/partitions/{MOVED}/pause", stay), 400, "NOT_A_MOVE"),
            (call("POST", f"{url}/pause", {"generation": 2}), 400, "BAD_ASSIGNMENT"),
        ]
        for response, status, code in cases:
            assert (response.status_code, response.json()["error"]) == (status, code), response.text
        assert (digest(a, MOVED), digest(b, MOVED), serving(a, b)) == before
        assert ok(call("GET", f"{a}/internal/ownership"))["generation"] == 1
        # Changes since a name the instance does not hold: the whole state.
        unknown = ok(call("GET", f"{a}/internal/partitions/{MOVED}/export?since=nobody"))
        assert "changes" not in unknown
        assert unknown["digest"] == before[0]
        # The same import twice gives the same state (idempotent).
        assert import_(b, good)["digest"] == good["digest"] == import_(b, good)["digest"]
