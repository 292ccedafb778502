"""Fenced ownership in real processes (decision 0019): queue-writers and retainers on the real
Apache Kafka broker, started as their console scripts, told new generations through
`PUT /internal/ownership`. What a process consumes is read from its own `/metrics`: an
unreadable record put on a partition is counted (`relay_bus_records_rejected_total`) by the
process that reads that partition, and only by it."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_bus import clients, topics
from relay_runtime import exits
from tests import helpers

TOKEN = "fence-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PARTITIONS = 4
TOPIC_OF = {"relay-queue-writer": topics.QUEUE_COMMANDS, "relay-retainer": topics.PUBLICATIONS}


def _env(kafka: helpers.Kafka, data_dir: Path, ordinal: int, replicas: int) -> dict[str, str]:
    return {
        **kafka.env(),
        "RELAY_KAFKA__PARTITIONS": str(PARTITIONS),
        "RELAY_ADMIN_TOKEN": TOKEN,
        "RELAY_DATA__DIR": str(data_dir),
        "RELAY_DATA__ORDINAL": str(ordinal),
        "RELAY_DATA__REPLICAS": str(replicas),
    }


@contextmanager
def _pool(
    script: str, kafka: helpers.Kafka, root: Path, replicas: int, count: int | None = None
) -> Iterator[list[str]]:
    """`count` instances (default `replicas`) with RELAY_DATA__REPLICAS=`replicas`, started
    together (the later ordinals wait for instance 0's first assignment)."""
    with ExitStack() as stack:
        starting = [
            stack.enter_context(_started(script, _env(kafka, root / f"d{k}", k, replicas)))
            for k in range(count or replicas)
        ]
        yield starting


@contextmanager
def _started(script: str, env: dict[str, str]) -> Iterator[str]:
    with helpers.running_service(script, ready_timeout_s=60, **env) as url:
        yield url


def _state(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/internal/ownership", headers=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _install(url: str, generation: int, owners: list[int], replicas: int) -> httpx.Response:
    body = {"generation": generation, "partitions": len(owners), "replicas": replicas}
    return httpx.put(
        f"{url}/internal/ownership",
        json={**body, "assignment": owners},
        headers=AUTH,
        timeout=30,
    )


def _rejected(url: str, topic: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("relay_bus_records_rejected_total{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _put_unreadable(kafka: helpers.Kafka, topic: str, partition: int) -> None:
    async def send() -> None:
        producer = clients.producer(kafka.settings(), "fence-test")
        await producer.start()
        try:
            await producer.send_and_wait(kafka.prefix + topic, b"not a record", partition=partition)
        finally:
            await producer.stop()

    asyncio.run(send())


def _wait(what: str, check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _serving(urls: list[str]) -> list[list[int]]:
    return [_state(url)["serving"] for url in urls]


def _assert_one_owner_each(urls: list[str]) -> None:
    flat = [p for share in _serving(urls) for p in share]
    assert len(flat) == len(set(flat)), f"a partition has two owners: {_serving(urls)}"


@pytest.mark.parametrize("script", ["relay-queue-writer", "relay-retainer"])
def test_an_installed_generation_moves_serving_only_once_the_source_let_go(
    script: str, kafka: helpers.Kafka, tmp_path: Path
) -> None:
    topic = TOPIC_OF[script]
    with _pool(script, kafka, tmp_path, replicas=2) as (a, b):
        assert _serving([a, b]) == [[0, 2], [1, 3]]
        assert _state(a)["generation"] == 1
        _put_unreadable(kafka, topic, 1)
        _wait("b to read partition 1", lambda: _rejected(b, topic) == 1)
        assert _rejected(a, topic) == 0

        # Generation 2 moves partition 1 from b to a. Told to a first (the wrong order): a
        # must not serve it while b, still on generation 1, may.
        moved = [0, 0, 0, 1]
        first = _install(a, 2, moved, 2)
        assert first.status_code == 200, first.text
        assert first.json()["serving"] == [0, 2]
        assert first.json()["pending"] == [1]
        _assert_one_owner_each([a, b])

        # b lets go: the 200 comes after it stopped reading partition 1.
        released = _install(b, 2, moved, 2)
        assert released.status_code == 200, released.text
        assert released.json()["serving"] == [3]
        _put_unreadable(kafka, topic, 1)
        # a, told again, now takes partition 1: the queue-writer reads it from its own mark
        # (none on a: both records; carrying the data over is the hand-off's part), the
        # retainer from the group's committed offset, which b committed as it let go.
        taken = _install(a, 2, moved, 2)
        assert taken.json()["serving"] == [0, 1, 2]
        expected = 2 if script == "relay-queue-writer" else 1
        _wait("a to read partition 1", lambda: _rejected(a, topic) == expected)
        time.sleep(1.0)  # b had as long as a to read the second record
        assert _rejected(b, topic) == 1
        _assert_one_owner_each([a, b])
        recorded = json.loads((tmp_path / "d1" / "ownership.json").read_text())
        assert (recorded["v"], recorded["generation"], recorded["assignment"]) == (2, 2, moved)


def test_an_older_or_conflicting_generation_is_refused_and_changes_nothing(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    with _pool("relay-queue-writer", kafka, tmp_path, replicas=1) as (a,):
        assert _install(a, 3, [0, 0, 0, 0], 1).status_code == 200
        file = tmp_path / "d0" / "ownership.json"
        before, on_disk = _state(a), file.read_bytes()

        stale = _install(a, 2, [0, 0, 0, 0], 1)
        assert stale.status_code == 409
        assert stale.json()["error"] == "STALE_GENERATION"
        conflicting = _install(a, 3, [0, 1, 0, 0], 2)
        assert conflicting.status_code == 409
        assert conflicting.json()["error"] == "CONFLICTING_ASSIGNMENT"
        bad = [
            ({"generation": 4, "replicas": 1, "assignment": [0, 0]}, "PARTITIONS_MISMATCH"),
            ({"generation": 4, "replicas": 1, "assignment": [0, 0, 0, 5]}, "BAD_OWNER"),
            ({"generation": 0, "replicas": 1, "assignment": [0, 0, 0, 0]}, "BAD_GENERATION"),
            ({"generation": "4", "replicas": 1, "assignment": [0, 0, 0, 0]}, "BAD_ASSIGNMENT"),
        ]
        for body, code in bad:
            response = httpx.put(f"{a}/internal/ownership", json=body, headers=AUTH, timeout=10)
            assert (response.status_code, response.json()["error"]) == (400, code)
        garbled = httpx.put(f"{a}/internal/ownership", content=b"{", headers=AUTH, timeout=10)
        assert (garbled.status_code, garbled.json()["error"]) == (400, "BAD_JSON")
        for headers in ({}, {"authorization": "Bearer wrong"}):
            response = httpx.put(
                f"{a}/internal/ownership",
                json={"generation": 9, "replicas": 1, "assignment": [0, 0, 0, 0]},
                headers=headers,
                timeout=10,
            )
            assert (response.status_code, response.json()["error"]) == (403, "FORBIDDEN")
            assert httpx.get(f"{a}/internal/ownership", headers=headers).status_code == 403
        assert _state(a) == before
        assert file.read_bytes() == on_disk


def _v1(data_dir: Path, service: str, ordinal: int, replicas: int) -> None:
    data_dir.mkdir(parents=True)
    record = {"v": 1, "service": service, "ordinal": ordinal, "replicas": replicas}
    (data_dir / "ownership.json").write_text(json.dumps(record) + "\n")


@pytest.mark.parametrize("script", ["relay-queue-writer", "relay-retainer"])
def test_a_restart_with_another_replica_count_never_gives_a_partition_two_owners(
    script: str, kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """`helm upgrade --set ...replicas=3` from 2 on version 1 data dirs: every pod restarts
    with RELAY_DATA__REPLICAS=3 and a third, empty one joins; they keep generation 1 of the
    recorded split (p mod 2), and the new one owns nothing."""
    service = script.removeprefix("relay-")
    _v1(tmp_path / "d0", service, 0, 2)
    _v1(tmp_path / "d1", service, 1, 2)
    topic = TOPIC_OF[script]
    with _pool(script, kafka, tmp_path, replicas=3) as urls:
        assert _serving(urls) == [[0, 2], [1, 3], []]
        idle = _state(urls[2])
        assert idle["owns_nothing"] is True
        assert idle["generation"] == 1
        for partition in range(PARTITIONS):
            _put_unreadable(kafka, topic, partition)
        _wait("every partition read", lambda: sum(_rejected(u, topic) for u in urls) == 4)
        assert [_rejected(u, topic) for u in urls] == [2, 2, 0]
    for k in (0, 1):
        recorded = json.loads((tmp_path / f"d{k}" / "ownership.json").read_text())
        assert (recorded["v"], recorded["replicas"], recorded["assignment"]) == (
            2,
            2,
            [0, 1, 0, 1],
        )
    # And back down to two with RELAY_DATA__REPLICAS=2, then up to three again: still p mod 2.
    with _pool(script, kafka, tmp_path, replicas=2) as urls:
        assert _serving(urls) == [[0, 2], [1, 3]]
    with _pool(script, kafka, tmp_path, replicas=3) as urls:
        assert _serving(urls) == [[0, 2], [1, 3], []]


def test_an_empty_instance_above_0_waits_for_a_published_assignment_then_gives_up(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """Only instance 0 may start a pool's first generation: ordinal 1 on an empty volume and
    an empty `relay.ownership` serves nothing of its own accord, and says why."""
    env = _env(kafka, tmp_path / "d1", 1, 2)
    result = subprocess.run(
        [str(helpers.BIN / "relay-queue-writer")],
        env=helpers.service_env(RELAY_STARTUP_TIMEOUT_S="3", RELAY_HTTP__PORT="0", **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == exits.EXIT_UNAVAILABLE, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    assert "no queue-writer assignment is recorded or published yet" in errors[0]
    assert not (tmp_path / "d1" / "ownership.json").exists()


def test_an_instance_publishes_its_acceptance_again_when_the_topic_lost_it(
    kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """The fence counts an instance with nothing (or something else) published as serving
    nothing of its own; one whose record is overwritten (as after a broker lost its log and
    another record took the key) publishes what it serves again."""
    from relay_bus.ownership_log import OwnershipLog
    from relay_runtime.assignment import Assignment

    async def overwrite_then_read(wait_s: float) -> dict[int, Assignment]:
        log = OwnershipLog(kafka.settings(), "queue-writer", "fence-test")
        await log.start()
        try:
            await log.publish(0, Assignment(1, 2, (1, 1, 1, 1)))
            assert (await log.read(PARTITIONS))[0] == Assignment(1, 2, (1, 1, 1, 1))
            await asyncio.sleep(wait_s)
            return await log.read(PARTITIONS)
        finally:
            await log.close()

    with _pool("relay-queue-writer", kafka, tmp_path, replicas=1) as (a,):
        assert _state(a)["serving"] == [0, 1, 2, 3]
        published = asyncio.run(overwrite_then_read(12.0))
        assert published[0] == Assignment(1, 1, (0, 0, 0, 0))
        assert _state(a)["serving"] == [0, 1, 2, 3]


@pytest.mark.parametrize("script", ["relay-queue-writer", "relay-retainer"])
def test_the_partitions_of_an_ordinal_lost_with_its_volume_are_served_once_published_for_it(
    script: str, kafka: helpers.Kafka, tmp_path: Path
) -> None:
    """Ordinal 1 is gone for good (stopped, its volume deleted): the generation giving its
    partitions to ordinal 0 leaves them pending there (ordinal 1's publication of generation 1
    still claims them) until ordinal 0 publishes it for the lost ordinal. Should ordinal 1
    come back, on a new volume, it serves nothing."""
    topic = TOPIC_OF[script]
    with _started(script, _env(kafka, tmp_path / "d0", 0, 2)) as a:
        with _started(script, _env(kafka, tmp_path / "d1", 1, 2)) as b:
            _wait("generation 1 served", lambda: _serving([a, b]) == [[0, 2], [1, 3]])
        shutil.rmtree(tmp_path / "d1")

        def lost(ordinal: str, **headers: str) -> httpx.Response:
            url = f"{a}/internal/ownership/lost/{ordinal}"
            return httpx.post(url, headers=headers, timeout=30)

        before = _state(a)
        refused = [
            (lost("1", **AUTH), 409, "ORDINAL_OWNS"),  # generation 1 still gives it 1 and 3
            (lost("0", **AUTH), 400, "NOT_LOST"),
            (lost("x", **AUTH), 400, "BAD_ORDINAL"),
            (lost("1"), 403, "FORBIDDEN"),
        ]
        for response, status, code in refused:
            assert (response.status_code, response.json()["error"]) == (status, code)
        assert _state(a) == before

        assert _install(a, 2, [0, 0, 0, 0], 2).status_code == 200
        assert (_state(a)["serving"], _state(a)["pending"]) == ([0, 2], [1, 3])
        taken = lost("1", **AUTH)
        assert taken.status_code == 200, taken.text
        assert taken.json()["serving"] == [0, 1, 2, 3]
        _put_unreadable(kafka, topic, 1)
        _wait("a to read partition 1", lambda: _rejected(a, topic) == 1)

        with _started(script, _env(kafka, tmp_path / "d1", 1, 2)) as back:
            state = _state(back)
            assert (state["generation"], state["serving"], state["owns_nothing"]) == (2, [], True)
            _assert_one_owner_each([a, back])
