"""The bus against Apache Kafka: topics, typed send and consume, commits, and recovery when the
broker's log is wiped under it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from relay_bus import clients, schemas, topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.consumers import Received, Unreadable
from relay_runtime import exits
from relay_runtime.readiness import Readiness
from tests.helpers import Kafka, free_port


def _settings(kafka: Kafka, **extra: object) -> KafkaSettings:
    return kafka.settings(
        **{"partitions": 4, "inbox_partitions": 2, "topic_check_interval_s": 0.3, **extra}
    )


def _ping(n: int) -> schemas.Ping:
    now = schemas.now_ms_()
    return schemas.Ping(
        id=f"p{n}", origin="test", reply_slot=0, started_ms=now, deadline_ms=now + 60_000
    )


async def _eventually(
    check: Callable[[], bool], timeout_s: float = 20.0, state: Callable[[], object] = str
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached in time {state()}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def admin(kafka: Kafka) -> AsyncIterator[clients.AIOKafkaAdminClient]:
    client = clients.admin_client(_settings(kafka), "test-admin")
    await client.start()
    yield client
    await client.close()


async def test_start_creates_every_topic_with_its_partition_count(
    kafka: Kafka, admin: clients.AIOKafkaAdminClient
) -> None:
    bus = Bus(_settings(kafka), client_id="t", readiness=Readiness())
    await bus.start(5)
    try:
        described = {
            d["topic"].removeprefix(kafka.prefix): len(d["partitions"])
            for d in await admin.describe_topics([bus.physical(name) for name in bus.specs])
        }
        assert described == {name: spec.partitions for name, spec in bus.specs.items()}
        assert described[topics.QUEUE_COMMANDS] == 4
        assert described[topics.INGRESS_INBOX] == 2
        assert bus.readiness.ready
    finally:
        await bus.stop()


async def test_a_wrong_partition_count_stops_the_start(
    kafka: Kafka, admin: clients.AIOKafkaAdminClient
) -> None:
    await admin.create_topics([clients.NewTopic(kafka.prefix + topics.QUEUE_EVENTS, 3, 1)])
    bus = Bus(_settings(kafka), client_id="t", readiness=Readiness())
    with pytest.raises(
        exits.StartupError, match=r"relay\.queue\.events has 3 partitions, Relay needs 4"
    ) as caught:
        await bus.start(5)
    assert caught.value.exit_code == exits.EXIT_CONFIG
    await bus.stop()
    described = await admin.describe_topics([kafka.prefix + topics.QUEUE_EVENTS])
    assert len(described[0]["partitions"]) == 3  # an operator's topic is never touched


async def test_a_replication_factor_above_the_broker_count_stops_the_start(kafka: Kafka) -> None:
    bus = Bus(_settings(kafka, replication_factor=3), client_id="t", readiness=Readiness())
    with pytest.raises(
        exits.StartupError, match=r"has 1 broker\(s\), RELAY_KAFKA__REPLICATION_FACTOR is 3"
    ) as caught:
        await bus.start(2)
    assert caught.value.exit_code == exits.EXIT_CONFIG
    await bus.stop()


async def test_topics_get_min_insync_replicas_from_settings(kafka: Kafka) -> None:
    bus = Bus(_settings(kafka), client_id="t", readiness=Readiness())
    await bus.start(5)
    await bus.stop()
    admin = clients.admin_client(_settings(kafka), "t")
    await admin.start()
    try:
        found = await admin.describe_configs(
            [
                clients.ConfigResource(
                    clients.ConfigResourceType.TOPIC, bus.physical(topics.QUEUE_COMMANDS)
                )
            ]
        )
    finally:
        await admin.close()
    entries = {e[0]: e[1] for e in found[0].resources[0][4]}
    assert entries["min.insync.replicas"] == "1"


async def test_unreachable_broker_fails_within_the_budget() -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    bus = Bus(settings, client_id="t", readiness=Readiness())
    started = asyncio.get_running_loop().time()
    with pytest.raises(exits.StartupError, match=r"cannot reach Kafka at 127\.0\.0\.1:") as caught:
        await bus.start(1.5)
    assert caught.value.exit_code == exits.EXIT_UNAVAILABLE
    assert asyncio.get_running_loop().time() - started < 5


async def test_fixed_consumer_commits_and_resumes_after_handled_records(kafka: Kafka) -> None:
    seen: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        seen.append(received.record.id)

    settings = _settings(kafka)
    producer_bus = Bus(settings, client_id="producer", readiness=Readiness())
    await producer_bus.start(5)
    for n in range(5):
        await producer_bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=1)

    first = Bus(settings, client_id="c1", readiness=Readiness())
    first.consumer(topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[1])
    await first.start(5)
    await _eventually(lambda: len(seen) == 5)
    await first.stop()

    for n in range(5, 8):
        await producer_bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=1)
    second = Bus(settings, client_id="c2", readiness=Readiness())
    second.consumer(topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[1])
    await second.start(5)
    await _eventually(lambda: len(seen) == 8)
    await asyncio.sleep(0.5)
    await second.stop()
    await producer_bus.stop()
    assert seen == [f"p{n}" for n in range(8)]


async def test_committed_offsets_are_the_groups_own_under_the_prefix(kafka: Kafka) -> None:
    """`committed_offsets` reads what the group's consumer committed, and a consumer resumes
    from what `commit_offsets` set (a restored retainer's resume points): both name the group
    as the consumer does, under the topic prefix (`kafka` has one)."""
    assert kafka.prefix
    seen: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        seen.append(received.record.id)

    settings = _settings(kafka)
    bus = Bus(settings, client_id="producer", readiness=Readiness())
    await bus.start(5)
    try:
        for n in range(5):
            await bus.send(topics.PUBLICATIONS, _ping(n), partition=2)
        assert await bus.committed_offsets(topics.PUBLICATIONS, "g", [2]) == {2: None}
        first = Bus(settings, client_id="c1", readiness=Readiness())
        first.consumer(topics.PUBLICATIONS, handler, group_id="g", partitions=[2])
        await first.start(5)
        await _eventually(lambda: len(seen) == 5)
        await first.stop()
        assert await bus.committed_offsets(topics.PUBLICATIONS, "g", [2]) == {2: 5}

        await bus.commit_offsets(topics.PUBLICATIONS, "g", {2: 3})
        second = Bus(settings, client_id="c2", readiness=Readiness())
        second.consumer(topics.PUBLICATIONS, handler, group_id="g", partitions=[2])
        await second.start(5)
        await _eventually(lambda: len(seen) == 7)
        await second.stop()
        assert seen == [f"p{n}" for n in [0, 1, 2, 3, 4, 3, 4]]
    finally:
        await bus.stop()


async def test_a_client_that_began_past_its_start_offset_is_sought_back(kafka: Kafka) -> None:
    """aiokafka may apply a group's committed offset after the seek to `start_offsets` (the
    archiver once archived a file claiming offsets it never read). Emulated here by moving the
    client's position before the first fetch: the first record read gives it away, and reading
    starts again where it was sought."""
    seen: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        seen.append(received.record.id)

    async def start_offsets(partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 0)

    settings = _settings(kafka)
    producer_bus = Bus(settings, client_id="producer", readiness=Readiness())
    await producer_bus.start(5)
    for n in range(8):
        await producer_bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=2)
    await producer_bus.stop()
    bus = Bus(settings, client_id="c", readiness=Readiness())
    consumer = bus.consumer(
        topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[2], start_offsets=start_offsets
    )
    await bus.start(5)
    assert consumer._consumer is not None
    consumer._consumer.seek(clients.TopicPartition(bus.physical(topics.QUEUE_COMMANDS), 2), 4)
    await _eventually(lambda: len(seen) >= 8)
    await asyncio.sleep(0.3)
    await bus.stop()
    assert seen == [f"p{n}" for n in range(8)]


async def test_failing_handler_is_retried_and_unreadable_records_are_skipped(kafka: Kafka) -> None:
    settings = _settings(kafka)
    bus = Bus(settings, client_id="t", readiness=Readiness())
    attempts: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        attempts.append(received.record.id)
        if attempts.count("p0") == 1:
            raise RuntimeError("transient")

    bus.consumer(topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[0])
    await bus.start(5)
    producer = clients.producer(settings, "raw")
    await producer.start()
    await producer.send_and_wait(
        bus.physical(topics.QUEUE_COMMANDS), b'{"kind": "future", "v": 9}', partition=0
    )
    await producer.stop()
    await bus.send(topics.QUEUE_COMMANDS, _ping(0), partition=0)
    await bus.send(topics.QUEUE_COMMANDS, _ping(1), partition=0)
    await _eventually(lambda: attempts[-2:] == ["p0", "p1"])
    await bus.stop()
    assert attempts == ["p0", "p0", "p1"]


async def test_an_unreadable_record_goes_to_on_unreadable_once_it_succeeds(kafka: Kafka) -> None:
    """The archiver's hook: a record the handler never sees is handed over as Kafka holds it,
    retried like a handler until it returns, and reading goes on after it."""
    settings = _settings(kafka)
    bus = Bus(settings, client_id="t", readiness=Readiness())
    seen: list[str] = []
    unreadable: list[Unreadable] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        seen.append(received.record.id)

    async def on_unreadable(record: Unreadable) -> None:
        unreadable.append(record)
        if len(unreadable) == 1:
            raise RuntimeError("transient")

    bus.consumer(
        topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[0], on_unreadable=on_unreadable
    )
    await bus.start(5)
    await bus.send(topics.QUEUE_COMMANDS, _ping(0), partition=0)
    producer = clients.producer(settings, "raw")
    await producer.start()
    future = b'{"kind": "future", "v": 9}'
    await producer.send_and_wait(bus.physical(topics.QUEUE_COMMANDS), future, key=b"k", partition=0)
    await producer.stop()
    await bus.send(topics.QUEUE_COMMANDS, _ping(1), partition=0)
    await _eventually(lambda: seen == ["p0", "p1"])
    await bus.stop()
    assert len(unreadable) == 2  # the first attempt raised: handed over again
    assert unreadable[0] == unreadable[1]
    got = unreadable[1]
    assert (got.topic, got.partition, got.offset, got.key, got.value) == (
        topics.QUEUE_COMMANDS,
        0,
        1,
        b"k",
        future,
    )
    assert got.timestamp_ms > 0
    assert "unknown record kind" in got.error


async def test_group_consumer_gets_assigned_and_becomes_ready(kafka: Kafka) -> None:
    """Ready as soon as the group gave it partitions: the keeper's check (five minutes apart
    here) is not what tells the readiness."""
    readiness = Readiness()
    bus = Bus(_settings(kafka, topic_check_interval_s=300), client_id="t", readiness=readiness)
    got: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        got.append(received.record.id)

    bus.consumer(topics.QUEUE_EVENTS, handler, group_id="delivery")
    await bus.start(5)
    assert not readiness.ready  # the group has not been joined yet
    await _eventually(lambda: readiness.ready)
    await bus.send(topics.QUEUE_EVENTS, _ping(1), key=b"q1")
    await _eventually(lambda: got == ["p1"])
    await bus.stop()


async def test_a_wiped_broker_log_recreates_topics_and_rereads_from_the_start(
    own_kafka: Kafka,
) -> None:
    kafka = own_kafka
    settings = _settings(kafka)
    readiness = Readiness()
    bus = Bus(settings, client_id="t", readiness=readiness)
    seen: list[str] = []

    async def handler(received: Received) -> None:
        assert isinstance(received.record, schemas.Ping)
        seen.append(received.record.id)

    bus.consumer(topics.QUEUE_COMMANDS, handler, group_id="g", partitions=[2])
    await bus.start(5)
    for n in range(20):
        await bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=2)
    await _eventually(lambda: len(seen) == 20)
    old_epoch = bus.epoch

    kafka.cluster.wipe()
    await _eventually(lambda: not readiness.ready)
    kafka.start()
    await _eventually(lambda: bus.epoch != old_epoch and readiness.ready, 60)
    # The new log is shorter than the old position (20): without the reset the consumer
    # would wait at offset 20 and never see these.
    for n in range(100, 103):
        await bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=2)
    await _eventually(lambda: seen[-3:] == ["p100", "p101", "p102"])
    await bus.stop()


async def test_the_keeper_checks_topics_every_tenth_round_and_recreates_a_deleted_one(
    kafka: Kafka, admin: clients.AIOKafkaAdminClient
) -> None:
    """Between topic checks a keeper round reads only the epoch (one fetch, no metadata
    requests); a topic deleted under the running bus is back after a later topic check."""
    bus = Bus(_settings(kafka, topic_check_interval_s=0.05), client_id="t", readiness=Readiness())
    await bus.start(5)
    checked = bus.ensure_topics
    checks = 0

    async def counted() -> list[str]:
        nonlocal checks
        checks += 1
        return await checked()

    bus.ensure_topics = counted  # type: ignore[method-assign]
    events = kafka.prefix + topics.QUEUE_EVENTS
    await admin.delete_topics([events])
    deadline = asyncio.get_running_loop().time() + 20
    while events not in await admin.list_topics():
        assert asyncio.get_running_loop().time() < deadline, "the deleted topic is not back"
        await asyncio.sleep(0.1)
    assert checks >= 1
    before = checks
    await asyncio.sleep(1.5)  # at most 30 rounds
    assert checks - before <= 4, f"{checks - before} topic checks in 30 rounds"
    await bus.stop()


async def test_send_without_a_broker_raises_unavailable_within_its_budget(
    own_kafka: Kafka,
) -> None:
    from relay_bus.bus import SEND_BUDGET_S, BusUnavailableError

    kafka = own_kafka
    bus = Bus(_settings(kafka), client_id="t", readiness=Readiness())
    await bus.start(5)
    kafka.kill()
    started = asyncio.get_running_loop().time()
    with pytest.raises(BusUnavailableError, match=r"sending to relay\.queue\.commands failed"):
        await bus.send(topics.QUEUE_COMMANDS, _ping(1), partition=0)
    assert asyncio.get_running_loop().time() - started < SEND_BUDGET_S + 1
    await bus.stop()


async def test_a_rebalance_hands_on_nothing_fetched_before_it(kafka: Kafka) -> None:
    """A group rebalance runs in aiokafka's coordinator task while a batch is in the handler's
    hands: nothing fetched before a revocation or a seek is handed on after it, so a reader
    that keeps its own resume point (the archiver: start where the files end) sees each
    partition's offsets exactly once, in order, across members. Two members of one group share
    that resume point here; the second joins while the first is mid-batch."""
    events: list[tuple[str, int, int]] = []
    handled: dict[int, int] = {}
    revoked_at: list[float] = []

    def handler_of(name: str) -> Callable[[Received], Awaitable[None]]:
        async def handler(received: Received) -> None:
            await asyncio.sleep(0.004)  # a slow handler: the rebalance finds a batch in hand
            events.append((name, received.partition, received.offset))
            handled[received.partition] = received.offset + 1

        return handler

    async def start_offsets(partitions: list[int]) -> dict[int, int]:
        # What was handled is "archived" as it is handled: the next start, as the archiver's
        # files are (a member that stops leaves the group without a revocation).
        return {p: handled.get(p, 0) for p in partitions}

    async def revoked(partitions: list[int]) -> None:
        revoked_at.append(asyncio.get_running_loop().time())

    settings = _settings(kafka)
    producer_bus = Bus(settings, client_id="producer", readiness=Readiness())
    await producer_bus.start(5)
    per_partition = 150
    for n in range(per_partition):
        for p in range(4):
            await producer_bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=p)
    await producer_bus.stop()
    members = [Bus(settings, client_id=f"m{k}", readiness=Readiness()) for k in range(2)]
    for k, bus in enumerate(members):
        bus.consumer(
            topics.QUEUE_COMMANDS,
            handler_of(f"m{k}"),
            group_id="g-rebalance",
            start_offsets=start_offsets,
            on_revoked=revoked,
        )
    await members[0].start(5)
    await _eventually(lambda: len(events) >= 20)
    await members[1].start(5)
    await _eventually(lambda: bool(revoked_at))
    await _eventually(
        lambda: all(handled.get(p) == per_partition for p in range(4)),
        30,
        lambda: (handled, events[-20:]),
    )
    await asyncio.sleep(0.3)
    for bus in members:
        await bus.stop()
    for p in range(4):
        offsets = [offset for _, partition, offset in events if partition == p]
        assert offsets == list(range(per_partition)), (p, offsets)


async def test_a_failed_check_marks_kafka_unready_and_never_ends_the_keeper(
    own_kafka: Kafka,
) -> None:
    """The broker gone between the keeper's topic check and its epoch read: the epoch is not
    read back, and writing one is retried until the send budget runs out. The round counts
    that as Kafka not answering; it once raised `BusUnavailableError` out of the keeper, which
    then never checked again (a wiped log later went unnoticed, and readiness stayed true)."""
    readiness = Readiness()
    bus = Bus(_settings(own_kafka, topic_check_interval_s=300), client_id="t", readiness=readiness)
    await bus.start(5)
    topics_checked = bus.ensure_topics

    async def then_broker_gone() -> list[str]:
        created = await topics_checked()
        own_kafka.kill()
        return created

    bus.ensure_topics = then_broker_gone  # type: ignore[method-assign]
    assert await bus.check() is False
    assert not readiness.ready
    bus.ensure_topics = topics_checked  # type: ignore[method-assign]
    own_kafka.start()
    deadline = asyncio.get_running_loop().time() + 60
    while not await bus.check(healthy=False):  # the next rounds see it back
        assert asyncio.get_running_loop().time() < deadline
    assert readiness.ready
    await bus.stop()


async def test_a_batched_consumer_wakes_once_per_batch_and_misses_nothing(kafka: Kafka) -> None:
    """`fetch_min_bytes` (the archiver's): the broker holds each fetch until that much is
    written or `fetch_max_wait_ms` passes, so records written one by one reach the handler in
    a few batches, all of them and in order; a consumer on the request path (1 byte) gets each
    as it comes."""
    arrivals: dict[str, list[tuple[float, str]]] = {"batched": [], "eager": []}

    def handler(name: str) -> Callable[[Received], Awaitable[None]]:
        async def handle(received: Received) -> None:
            assert isinstance(received.record, schemas.Ping)
            arrivals[name].append((asyncio.get_running_loop().time(), received.record.id))

        return handle

    settings = _settings(kafka, fetch_max_wait_ms=400)
    bus = Bus(settings, client_id="batches", readiness=Readiness())
    bus.consumer(
        topics.QUEUE_COMMANDS,
        handler("batched"),
        group_id="batched",
        partitions=[2],
        fetch_min_bytes=1024 * 1024,
    )
    bus.consumer(topics.QUEUE_COMMANDS, handler("eager"), group_id="eager", partitions=[2])
    await bus.start(5)
    try:
        for n in range(60):
            await bus.send(topics.QUEUE_COMMANDS, _ping(n), partition=2)
            await asyncio.sleep(0.025)
        await _eventually(
            lambda: all(len(a) == 60 for a in arrivals.values()), 10, lambda: arrivals
        )
    finally:
        await bus.stop()

    def wakes(times: list[float]) -> int:
        return 1 + sum(1 for a, b in itertools.pairwise(times) if b - a > 0.015)

    for name, got in arrivals.items():
        assert [i for _, i in got] == [f"p{n}" for n in range(60)], name
    batched = wakes([t for t, _ in arrivals["batched"]])
    eager = wakes([t for t, _ in arrivals["eager"]])
    assert batched <= 8, arrivals["batched"]
    assert eager >= 20, arrivals["eager"]
