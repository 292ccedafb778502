"""Hand-off of one retainer partition between real processes (decision 0022): two retainers on
the real Apache Kafka broker, started as their console script, a load of retained publishes
and durable-stream stores put on the moved partition of `relay.publications` as the ingress
puts them, their answers read back from the ingress inbox, and the operator's part played by
`handoff_calls.move`."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relay_bus import routing, schemas, topics
from relay_durable import codec
from relay_streams import partition_state as ps
from relay_streams.retained import Retained
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
KEPT = 2
"""A partition that stays on the source all along."""
DB = "messages"
TOPICS = 6
INTERVAL_S = 0.02


def one_then_two(kafka: helpers.Kafka, root: Path) -> AbstractContextManager[tuple[str, str]]:
    """`handoff_calls.one_then_two` of relay-retainers."""
    return handoff_calls.one_then_two("relay-retainer", kafka, root)


def topics_of(partition: int, prefix: str) -> list[str]:
    found = (f"{prefix}/{i}" for i in range(10_000))
    return [t for t in found if routing.partition_of_topic(t, PARTITIONS) == partition][:TOPICS]


@dataclass
class Load(InboxLoad):
    """In turn, on `TOPICS` topics of one partition: a retained publish (payload: its rank) and
    a durable-stream store of one message (the same rank), one pair every `interval_s` until
    stopped, awaiting only Kafka's acknowledgement; answers read from the inbox by id."""

    partition: int
    interval_s: float = INTERVAL_S
    sent: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(request id, "retained" or "stream", topic, payload text) in the order put on Kafka."""
    started: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.run_in_thread()
        assert self.started.wait(60), self.error

    def is_reply(self, record: object) -> bool:
        return isinstance(record, schemas.DsReply)

    async def produce(self, producer: Any) -> None:
        publications = self.topic(topics.PUBLICATIONS)
        retained, streams = topics_of(self.partition, "r"), topics_of(self.partition, "s")
        rank = 0
        while not self.stop.is_set():
            payload = f"{rank:06d}"
            now = int(time.time() * 1000)
            publish = schemas.Publication(
                **self.request(),
                topic=retained[rank % TOPICS],
                payload=codec.b64u(payload.encode()),
                ts=now,
                retain=True,
            )
            message = schemas.DsMessage(
                topic=streams[rank % TOPICS], payload=codec.b64u(payload.encode()), ts=now
            )
            store = schemas.DsRequest(**self.request(), op="store", db=DB, messages=(message,))
            for record, kind, topic in (
                (publish, "retained", publish.topic),
                (store, "stream", message.topic),
            ):
                await producer.send_and_wait(
                    publications, schemas.encode(record), partition=self.partition
                )
                self.sent.append((record.id, kind, topic, payload))
            rank += 1
            self.started.set()
            await asyncio.sleep(self.interval_s)
        await self.answered([i for i, *_ in self.sent])

    def finish(self) -> tuple[dict[str, str], dict[str, list[str]]]:
        """Stop, wait for every answer; each retained topic's last payload and each stream
        topic's payloads in send order, all acknowledged (202 and 201, checked)."""
        self.stop.set()
        assert self.done.wait(90)
        assert self.error is None, repr(self.error)
        last: dict[str, str] = {}
        stored: dict[str, list[str]] = {}
        for i, kind, topic, payload in self.sent:
            assert self.replies[i].status == (202 if kind == "retained" else 201), self.replies[i]
            if kind == "retained":
                last[topic] = payload
            else:
                stored.setdefault(topic, []).append(payload)
        return last, stored

    def finish_unanswered(self, wait_s: float = 15.0) -> int:
        """Stop, giving answers `wait_s` to come (a retainer SIGKILLed with writes in hand
        never answers them: not acknowledged, they may or may not be stored); how many
        writes stay unanswered."""
        self.stop.set()
        deadline = time.monotonic() + wait_s
        while any(i not in self.replies for i, *_ in self.sent) and time.monotonic() < deadline:
            time.sleep(0.1)
        return sum(1 for i, *_ in self.sent if i not in self.replies)

    def differences(self, found: tuple[dict[str, str], dict[str, list[str]]]) -> str:
        """ "" when `found` (`held`) holds every acknowledged write and nothing never sent:
        each retained topic the last acknowledged payload or a later unacknowledged one; each
        stream topic the payloads sent, in order, every acknowledged one among them."""
        retained, streams = found
        problems = []
        sent: dict[tuple[str, str], list[tuple[str, bool]]] = {}
        for i, kind, topic, payload in self.sent:
            reply = self.replies.get(i)
            sent.setdefault((kind, topic), []).append(
                (payload, reply is not None and reply.status in (201, 202))
            )
        for (kind, topic), writes in sorted(sent.items()):
            acked = [n for n, (_, ok_) in enumerate(writes) if ok_]
            if kind == "retained":
                have = retained.get(topic)
                allowed = {p for n, (p, _) in enumerate(writes) if not acked or n >= acked[-1]}
                if (have is None and acked) or (have is not None and have not in allowed):
                    problems.append(f"{topic}: holds {have}, last acknowledged {acked[-1:]}")
                continue
            have_all = streams.get(topic, [])
            order = {p: n for n, (p, _) in enumerate(writes)}
            ranks = [order.get(p, -1) for p in have_all]
            missing = [writes[n][0] for n in acked if writes[n][0] not in set(have_all)]
            if missing or -1 in ranks or ranks != sorted(set(ranks)):
                problems.append(f"{topic}: missing {missing[:5]}, held {have_all[:5]}...")
        return "; ".join(problems)


def belongs(partition: int) -> Callable[[str], bool]:
    return lambda topic: routing.partition_of_topic(topic, PARTITIONS) == partition


def held(url: str, partition: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    """What the retainer at `url` holds of `partition`: retained payloads, stream payloads."""
    state = ps.from_json(export(url, partition), belongs(partition))
    stored: dict[str, list[str]] = {}
    for _db, messages in state.streams:
        for m in messages:
            stored.setdefault(m.topic, []).append(m.payload.decode())
    return {m.topic: m.payload.decode() for m in state.retained}, stored


def test_a_partition_moves_from_one_retainer_to_two_under_load(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        assert serving(a, b) == [[0, 1, 2, 3], []]
        # As fast as Kafka takes them: writes of the moved partition are in flight at the pause
        load, kept = Load(kafka, MOVED, interval_s=0.0), Load(kafka, KEPT)
        load.start()
        kept.start()
        time.sleep(1.0)
        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2)
        assert not load.done.is_set()  # the move happened under the load
        steps = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in moved.steps_s.items())
        print(
            f"\nretainer move of partition {MOVED}: pause {moved.pause_s * 1000:.0f} ms "
            f"({steps}), prefetch {moved.prefetch_s * 1000:.0f} ms, {len(load.sent)} writes"
        )
        assert moved.committed, moved
        # The catch-up carried only what the load wrote since the prefetch.
        assert moved.carried["whole"] is False, moved.carried
        assert 0 < moved.carried["messages"] < len(load.sent), moved.carried
        time.sleep(1.0)
        acknowledged, kept_acknowledged = load.finish(), kept.finish()

        assert serving(a, b) == [[0, 2, 3], [1]]
        assert len(load.sent) > 40
        # Every acknowledged write is on the target, streams in the order sent, nothing else.
        assert held(b, MOVED) == acknowledged
        assert held(a, KEPT) == kept_acknowledged
        assert held(b, KEPT) == ({}, {})
        # The source forgot its copy (release).
        assert digest(a, MOVED) == ps.digest(ps.empty(MOVED, PARTITIONS))


def test_a_catch_up_over_a_state_not_the_prefetched_one_pulls_the_whole_partition(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """Changes since the prefetch, installed over anything else (here a copy with a retained
    topic the source never held, put back under the source's name for its copy), do not give
    the source's digest: the target pulls the whole partition, and the move commits with equal
    digests, losing nothing."""
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka, MOVED)
        load.start()
        time.sleep(0.5)

        def put_back_another_state() -> None:
            copy = export(a, MOVED)  # the source's copy and the name of its watch
            extra = next(t for t in (f"e/{i}" for i in range(100)) if belongs(MOVED)(t))
            state = ps.from_json(copy, belongs(MOVED))
            other = ps.PartitionState(
                MOVED,
                PARTITIONS,
                state.mark,
                tuple(
                    sorted((*state.retained, Retained(extra, b"x", 0, 1)), key=lambda m: m.topic)
                ),
                state.streams,
            )
            import_(b, {**ps.to_json(other), "since": copy["since"]})

        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2, after_prefetch=put_back_another_state)
        assert moved.committed, moved
        assert moved.source_digest == moved.target_digest
        assert moved.carried["whole"] is True, moved.carried
        assert moved.carried["differed"] is not None, moved.carried  # the changes came first
        acknowledged = load.finish()
        assert held(b, MOVED) == acknowledged


def test_a_pause_past_its_budget_rolls_back_and_the_source_keeps_everything(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka, MOVED)
        load.start()
        time.sleep(0.5)
        moved = move(a, b, MOVED, [0, 0, 0, 0], generation=2, budget_s=0.0)
        assert not moved.committed
        time.sleep(0.5)
        acknowledged = load.finish()
        assert serving(a, b) == [[0, 1, 2, 3], []]
        assert held(a, MOVED) == acknowledged
        assert digest(b, MOVED) == ps.digest(ps.empty(MOVED, PARTITIONS))


def test_bad_hand_off_requests_are_refused_and_change_nothing(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with one_then_two(kafka, tmp_path) as (a, b):
        load = Load(kafka, MOVED)
        load.start()
        time.sleep(0.3)
        load.finish()
        good = export(a, MOVED)
        del good["serving"]
        before = (digest(a, MOVED), digest(b, MOVED), serving(a, b))
        assert before[0] != before[1]
        url = f"{b}/internal/partitions/{MOVED}"
        other = next(
            t
            for t in (f"x/{i}" for i in range(100))
            if routing.partition_of_topic(t, PARTITIONS) != MOVED
        )
        foreign = {**good, "retained": [[other, "YQ", 0, 1, None]]}
        cases = [
            (call("PUT", f"{url}/import", {**good, "digest": "0" * 64}), 400, "BAD_STATE"),
            (call("PUT", f"{url}/import", foreign), 400, "BAD_STATE"),
            (
                call("PUT", f"{url}/import", {**good, "streams": {DB: [["s/0", -1, "YQ"]]}}),
                400,
                "BAD_STATE",
            ),
            (call("PUT", f"{b}/internal/partitions/2/import", good), 400, "PARTITION_MISMATCH"),
            (call("PUT", f"{url}/import", {**good, "partitions": 8}), 400, "PARTITION_MISMATCH"),
            (httpx.put(f"{url}/import", content=b"{", headers=AUTH), 400, "BAD_JSON"),
            (httpx.put(f"{url}/import", json=good), 403, "FORBIDDEN"),
            (call("PUT", f"{a}/internal/partitions/{MOVED}/import", good), 409, "PARTITION_SERVED"),
            (call("DELETE", f"{a}/internal/partitions/{MOVED}"), 409, "PARTITION_SERVED"),
            (call("POST", f"{url}/catch-up", {"source": a}), 409, "SOURCE_SERVING"),
        ]
        for response, status, code in cases:
            assert (response.status_code, response.json().get("error")) == (status, code), (
                response.request.method,
                response.request.url,
                response.text,
            )
        assert (digest(a, MOVED), digest(b, MOVED), serving(a, b)) == before

        # A good import installs the source's state; the same import twice, the same state.
        assert import_(b, good)["digest"] == good["digest"] == import_(b, good)["digest"]
        assert held(b, MOVED) == held(a, MOVED)
        ok(call("DELETE", url))
        assert digest(b, MOVED) == before[1]
