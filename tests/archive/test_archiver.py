"""The archiver against Apache Kafka and a real folder: every record of the archived topics
lands in exactly one file range across SIGKILLs, restarts resume from the archive, a file is
never half-visible, and a wiped broker log is archived under a new epoch."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest

from relay_archive import layout, reader, writer
from relay_archive.selection import ARCHIVED
from relay_archive.store import ArchiveStore, LocalStore
from relay_archiver.app import build
from relay_archiver.archiving import Archiver, Timing
from relay_archiver.settings import ArchiverSettings
from relay_bus import clients, schemas, topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_bus.consumers import Received
from relay_runtime.readiness import Readiness
from tests.helpers import BIN, ROOT, Kafka, child_command, free_port, service_env

PARTITIONS = 2


def _env(kafka: Kafka, data_dir: Path, port: int, **more: str) -> dict[str, str]:
    return service_env(
        **kafka.env(),
        RELAY_KAFKA__PARTITIONS=str(PARTITIONS),
        RELAY_KAFKA__INBOX_PARTITIONS=str(PARTITIONS),
        RELAY_KAFKA__TOPIC_CHECK_INTERVAL_S="0.3",
        RELAY_HTTP__PORT=str(port),
        RELAY_DATA__DIR=str(data_dir),
        RELAY_ARCHIVE__ROLL_AGE_S="0.3",
        RELAY_ARCHIVE__ROLL_BYTES="6000",
        RELAY_ARCHIVE__LAG_INTERVAL_S="0.3",
        RELAY_INSTANCE="archiver-test",
        **more,
    )


@contextmanager
def archiver(
    kafka: Kafka, data_dir: Path, **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A `relay-archiver` process; `env`: more settings (RELAY_ARCHIVE__LOCATION, ...)."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "relay-archiver")],
        env=_env(kafka, data_dir, port, **env),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 40
        while True:
            assert process.poll() is None, process.communicate()[1][-2000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "archiver not ready"
            time.sleep(0.1)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@asynccontextmanager
async def producer(kafka: Kafka) -> AsyncIterator[Bus]:
    settings = kafka.settings(partitions=PARTITIONS, inbox_partitions=PARTITIONS)
    bus = Bus(settings, client_id="test-producer", readiness=Readiness())
    await bus.start(20)
    try:
        yield bus
    finally:
        await bus.stop()


def _send(n: int) -> schemas.SendMessage:
    now = schemas.now_ms_()
    return schemas.SendMessage(
        id=f"c{n}",
        origin="test",
        reply_slot=0,
        deadline_ms=now + 60_000,
        sender="s" * 32,
        msg_id=f"m{n}",
        body="aGVsbG8",
    )


async def _produce(bus: Bus, start: int, count: int) -> None:
    for n in range(start, start + count):
        await bus.send(topics.QUEUE_COMMANDS, _send(n), partition=n % PARTITIONS)
        reply = schemas.QueueReply(id=f"c{n}", origin="test", status=201, data={"ts": n})
        await bus.send(topics.INGRESS_INBOX, reply, partition=n % PARTITIONS)
        deliver = schemas.Deliver(frame="END", conn="c", queue="q")
        await bus.send(topics.INGRESS_INBOX, deliver, partition=n % PARTITIONS)


def _ends(store: ArchiveStore, epoch: str, topic: str) -> dict[int, int]:
    return reader.resume_points(store, epoch, topic)


async def _caught_up(store: ArchiveStore, bus: Bus, timeout_s: float = 30) -> None:
    assert bus.epoch is not None
    deadline = time.monotonic() + timeout_s
    for topic in (topics.QUEUE_COMMANDS, topics.INGRESS_INBOX):
        want = await bus.end_offsets(topic, list(range(PARTITIONS)))
        while _ends(store, bus.epoch, topic) != want:
            assert time.monotonic() < deadline, (topic, _ends(store, bus.epoch, topic), want)
            await asyncio.sleep(0.1)


def _check_complete(store: ArchiveStore, epoch: str, sent: int) -> None:
    commands = reader.scan(store, epoch, topics.QUEUE_COMMANDS)
    missing = {f"c{n}" for n in range(sent)} - set(commands.table["id"].to_pylist())
    files = [(f.slot.topic, f.slot.partition, f.first, f.last) for f in store.list_files()]
    assert not missing, (sorted(missing), sorted(files))
    assert sorted(commands.table["id"].to_pylist()) == sorted(f"c{n}" for n in range(sent))
    for partition, cover in commands.coverage.items():
        assert (cover.first, cover.gaps, cover.overlaps) == (0, (), 0), partition
    inbox = reader.scan(store, epoch, topics.INGRESS_INBOX)
    # every reply kept once, no delivery kept, and yet every inbox offset covered
    assert sorted(inbox.table["id"].to_pylist()) == sorted(f"c{n}" for n in range(sent))
    assert set(inbox.table["kind"].to_pylist()) == {"queue_reply"}
    for cover in inbox.coverage.values():
        assert (cover.first, cover.gaps, cover.overlaps) == (0, (), 0)
    assert sum(c.last + 1 for c in inbox.coverage.values()) == 2 * sent


async def test_every_record_archived_once_across_sigkills(kafka: Kafka, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "archive")
    sent = 0
    behind_at_kill = []
    async with producer(kafka) as bus:
        assert bus.epoch is not None
        for round_ in range(4):
            with archiver(kafka, tmp_path) as (process, url):
                await _produce(bus, sent, 150)
                sent += 150
                # kill at a different moment of each round: mid-stream, after a roll, at once
                await asyncio.sleep([0.0, 0.35, 0.8, 1.5][round_])
                process.send_signal(signal.SIGKILL)
                process.wait()
            ends = await bus.end_offsets(topics.QUEUE_COMMANDS, list(range(PARTITIONS)))
            behind_at_kill.append(_ends(store, bus.epoch, topics.QUEUE_COMMANDS) != ends)
        # the kills hit an archiver with records read but not yet in a file
        assert any(behind_at_kill), behind_at_kill
        with archiver(kafka, tmp_path) as (process, url):
            await _produce(bus, sent, 50)
            sent += 50
            await _caught_up(store, bus)
            metrics = httpx.get(f"{url}/metrics").text
            process.send_signal(signal.SIGTERM)
            assert process.wait(15) == 0
        assert 'relay_archiver_records_total{topic="relay.queue.commands"}' in metrics
        _check_complete(store, bus.epoch, sent)


async def test_lag_is_reported_then_caught_up(kafka: Kafka, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "archive")
    async with producer(kafka) as bus:
        await _produce(bus, 0, 40)
        with archiver(kafka, tmp_path) as (_, url):
            await _caught_up(store, bus)
            deadline = time.monotonic() + 10
            while True:
                lines = [
                    line
                    for line in httpx.get(f"{url}/metrics").text.splitlines()
                    if line.startswith("relay_archiver_lag_records{")
                ]
                if len(lines) == 3 * PARTITIONS and all(line.endswith(" 0.0") for line in lines):
                    break
                assert time.monotonic() < deadline, lines
                await asyncio.sleep(0.2)


async def test_records_this_build_cannot_read_are_kept_as_kafka_holds_them(
    kafka: Kafka, tmp_path: Path
) -> None:
    """A newer build's record (unknown version), foreign bytes: the bus skips them, the archive
    keeps them on a topic archived whole (and a reply of a newer version on the inbox), each
    row with Kafka's offset, timestamp and key and the exact bytes; an unknown kind on the
    inbox is covered, not kept, like a delivery."""
    store = LocalStore(tmp_path / "archive")
    future_command = b'{"kind": "queue_cmd", "v": 99, "id": "c-future", "new": true}'
    future_reply = b'{"kind": "queue_reply", "v": 99, "id": "c-future"}'
    async with producer(kafka) as bus:
        assert bus.epoch is not None
        raw = clients.producer(bus.settings, "raw-test")
        await raw.start()
        try:
            before_ms = int(time.time() * 1000)
            with archiver(kafka, tmp_path):
                await _produce(bus, 0, 2)  # offsets 0 of each partition: readable records
                physical = bus.physical
                sends = [
                    (topics.QUEUE_COMMANDS, future_command, b"k1"),
                    (topics.QUEUE_COMMANDS, b"\xff not json", None),
                    (topics.INGRESS_INBOX, future_reply, None),
                    (topics.INGRESS_INBOX, b'{"kind": "future_kind", "v": 1}', None),
                ]
                for topic, value, key in sends:
                    await raw.send_and_wait(physical(topic), value, key=key, partition=0)
                await _produce(bus, 2, 2)  # read after them: the bus went on
                await _caught_up(store, bus)
            after_ms = int(time.time() * 1000)
        finally:
            await raw.stop()
        commands = reader.scan(store, bus.epoch, topics.QUEUE_COMMANDS).table.to_pylist()
        inbox = reader.scan(store, bus.epoch, topics.INGRESS_INBOX)
    on_0 = [r for r in commands if r["partition"] == 0]
    assert [r["offset"] for r in on_0] == [0, 1, 2, 3]
    assert [(r["value"], r["key"], r["kind"], r["v"], r["id"]) for r in on_0[1:3]] == [
        (future_command, b"k1", "queue_cmd", 99, "c-future"),
        (b"\xff not json", None, "", 0, ""),
    ]
    assert on_0[3]["id"] == "c2"
    assert all(before_ms <= r["timestamp_ms"] <= after_ms for r in commands)
    replies = [r for r in inbox.table.to_pylist() if r["partition"] == 0]
    assert [r["value"] for r in replies if r["id"] == "c-future"] == [future_reply]
    assert [r["id"] for r in replies] == ["c0", "c-future", "c2"]
    # reply, delivery, the two raw records, reply, delivery: every offset covered
    assert (inbox.coverage[0].first, inbox.coverage[0].last, inbox.coverage[0].gaps) == (0, 5, ())


async def test_a_log_replaced_under_a_partition_is_never_filed_under_the_old_epoch(
    tmp_path: Path,
) -> None:
    """Between a wipe and the keeper noticing it, the consumer resets to the new log's start:
    a read below the slot's buffer start fails (retried by the bus) instead of being skipped
    as already buffered and the new log then filed under the old epoch; offsets read again
    within the buffer (a handler retry, a batch in hand across a rebalance's seek) are
    skipped; once the bus knows the new epoch, the new log goes to its own folder.
    (`Archiver` on a real folder, its bus not connected: the keeper's part, setting `epoch`,
    is done by hand.)"""
    store = LocalStore(tmp_path)
    bus = Bus(KafkaSettings(), client_id="t", readiness=Readiness())
    bus.epoch = "old"
    archiver = Archiver(bus, store, writer.RollPolicy(), Timing())

    def received(offset: int, n: int) -> Received:
        record = _send(n)
        value = schemas.encode(record)
        return Received(topics.QUEUE_COMMANDS, 0, offset, None, record, value, 1_000 + n)

    await archiver.resume(topics.QUEUE_COMMANDS, [0])
    for offset in range(4):
        await archiver.add(topics.QUEUE_COMMANDS, received(offset, offset))
    assert await archiver.resume(topics.QUEUE_COMMANDS, [0]) == {0: 4}  # a file 0..3
    for offset in range(4, 10):
        await archiver.add(topics.QUEUE_COMMANDS, received(offset, offset))
    for offset in (9, 4, 7):  # read again: skipped
        await archiver.add(topics.QUEUE_COMMANDS, received(offset, offset))
    with pytest.raises(writer.OutOfOrder):
        await archiver.add(topics.QUEUE_COMMANDS, received(0, 100))  # the new log's first
    with pytest.raises(writer.OutOfOrder):
        await archiver.add(topics.QUEUE_COMMANDS, received(3, 103))
    bus.epoch = "new"  # the keeper noticed
    for offset in range(3):
        await archiver.add(topics.QUEUE_COMMANDS, received(offset, 100 + offset))
    await archiver.close()
    old = reader.scan(store, "old", topics.QUEUE_COMMANDS).table
    assert old["id"].to_pylist() == [f"c{n}" for n in range(10)]
    new = reader.scan(store, "new", topics.QUEUE_COMMANDS).table
    assert new["id"].to_pylist() == ["c100", "c101", "c102"]
    assert new["offset"].to_pylist() == [0, 1, 2]


def test_sigkill_between_write_and_rename_leaves_nothing_visible(tmp_path: Path) -> None:
    child = subprocess.run(
        child_command("tests.archive.crash_child", str(tmp_path), "3"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL
    assert child.stdout.split() == ["1", "2", "3"]
    store = LocalStore(tmp_path)
    folder = tmp_path / layout.Slot("e1", "relay.queue.commands", 0).folder
    temporary = [p for p in os.listdir(folder) if p.startswith(layout.TEMP_PREFIX)]
    assert len(temporary) == 1  # the fourth file, complete but never renamed
    assert [f.last for f in store.list_files()] == [9, 19, 29]
    assert reader.resume_points(store, "e1", "relay.queue.commands") == {0: 30}
    assert store.clean_temporary() == 1
    assert reader.scan(store, "e1", "relay.queue.commands").table.num_rows == 30


async def test_a_wiped_broker_log_is_archived_under_a_new_epoch(
    own_kafka: Kafka, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "archive")
    with archiver(own_kafka, tmp_path):
        async with producer(own_kafka) as bus:
            first_epoch = bus.epoch
            assert first_epoch is not None
            await _produce(bus, 0, 30)
            await _caught_up(store, bus)
        own_kafka.cluster.wipe()
        own_kafka.cluster.start()
        async with producer(own_kafka) as bus:
            assert bus.epoch not in (None, first_epoch)
            await _produce(bus, 100, 20)
            await _caught_up(store, bus, timeout_s=60)
            assert reader.epochs(store) == sorted([first_epoch, bus.epoch])
            new = reader.scan(store, bus.epoch, topics.QUEUE_COMMANDS)
            assert sorted(new.table["id"].to_pylist()) == sorted(f"c{n}" for n in range(100, 120))
        _check_complete(store, first_epoch, 30)


def test_the_archiver_reads_kafka_in_batches_of_its_setting(tmp_path: Path) -> None:
    """No request waits for the archiver: each of its consumers asks Kafka for
    `RELAY_ARCHIVE__FETCH_MIN_BYTES` per fetch (`test_bus` shows what that does)."""
    config = ArchiverSettings(data={"dir": tmp_path}, archive={"fetch_min_bytes": 4096})
    _, lifecycle = build(config)
    assert [c.fetch_min_bytes for c in lifecycle.bus.consumers] == [4096] * len(ARCHIVED)
    assert ArchiverSettings().archive.fetch_min_bytes == 256 * 1024
