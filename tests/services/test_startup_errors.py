"""Each start-up error of a service process: its one-line message and exit code, no traceback.

The real console scripts run as child processes, as relayctl and Kubernetes run them.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from relay_runtime import exits
from tests import helpers
from tests.helpers import BIN, Kafka, free_port, service_env


def _run(script: str, timeout_s: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / script)],
        env=service_env(**{"RELAY_STARTUP_TIMEOUT_S": "2", **env}),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _assert_one_line(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("script", "env", "fragments"),
    [
        (
            "relay-delivery",
            {"RELAY_KAFKA__BOOTSTRAP_SERVERS": "kafka"},
            ["RELAY_KAFKA__BOOTSTRAP_SERVERS"],
        ),
        ("relay-ingress", {"RELAY_REDIS_URL": "http://x"}, ["RELAY_REDIS_URL"]),
        ("relay-retainer", {"RELAY_HTTP__PORT": "-1"}, ["RELAY_HTTP__PORT"]),
        ("relay-replicator", {"RELAY_STARTUP_TIMEOUT_S": "soon"}, ["RELAY_STARTUP_TIMEOUT_S"]),
        ("relay-queue-writer", {"RELAY_DATA__REPLICAS": "0"}, ["RELAY_DATA__REPLICAS"]),
    ],
)
def test_invalid_settings(
    script: str, env: dict[str, str], fragments: list[str], tmp_path: Path
) -> None:
    result = _run(script, RELAY_DATA__DIR=str(tmp_path), **env)
    _assert_one_line(result, exits.EXIT_CONFIG, f"{script}: error: ", *fragments)


@pytest.mark.parametrize("script", ["relay-queue-writer", "relay-ingress"])
def test_unreachable_broker(script: str, tmp_path: Path, redis_url: str) -> None:
    result = _run(
        script,
        RELAY_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}",
        RELAY_REDIS_URL=redis_url,
        RELAY_HTTP__PORT="0",
        RELAY_DATA__DIR=str(tmp_path),
    )
    _assert_one_line(result, exits.EXIT_UNAVAILABLE, "cannot reach Kafka at 127.0.0.1:")


def test_unreachable_redis(kafka: Kafka) -> None:
    result = _run(
        "relay-ingress",
        **kafka.env(),
        RELAY_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        RELAY_HTTP__PORT="0",
    )
    _assert_one_line(result, exits.EXIT_UNAVAILABLE, "cannot reach Redis at redis://127.0.0.1:")


def test_port_in_use(kafka: Kafka, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run(
            "relay-retainer",
            **kafka.env(),
            RELAY_HTTP__PORT=str(port),
            RELAY_DATA__DIR=str(tmp_path),
        )
    _assert_one_line(result, exits.EXIT_OSERR, f"port {port} on 127.0.0.1 is in use")


def test_mismatched_topic_on_a_keeping_broker_is_refused(kafka: Kafka, redis_url: str) -> None:
    import asyncio

    from relay_bus import clients, topics

    async def make_topic() -> None:
        admin = clients.admin_client(kafka.settings(), "t")
        await admin.start()
        await admin.create_topics([clients.NewTopic(kafka.prefix + topics.QUEUE_EVENTS, 3, 1)])
        await admin.close()

    asyncio.run(make_topic())
    result = _run(
        "relay-delivery",
        **kafka.env(),
        RELAY_REDIS_URL=redis_url,
        RELAY_HTTP__PORT="0",
    )
    _assert_one_line(
        result,
        exits.EXIT_CONFIG,
        f"{kafka.prefix}relay.queue.events has 3 partitions, Relay needs 8",
    )


def test_sigterm_stops_a_service_within_ten_seconds(
    kafka: Kafka, tmp_path: Path, redis_url: str
) -> None:
    import time

    import httpx

    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "relay-delivery")],
        env=service_env(
            **kafka.env(),
            RELAY_REDIS_URL=redis_url,
            RELAY_HTTP__PORT=str(port),
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        assert 'relay_ready{condition="consumer:relay.queue.events"} 1.0' in metrics
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json() == {"status": "ok"}
        started = time.monotonic()
        process.terminate()
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
        assert time.monotonic() - started < 10
        assert helpers.port_free(port)
        assert '"event": "stopped"' in stderr
        import json

        for line in stderr.splitlines():
            entry = json.loads(line)  # every line is one JSON object
            assert entry["service"] == "relay-delivery"
            assert entry["instance"]
    finally:
        process.kill()


def test_corrupt_store_log_stops_the_start_unless_repairing(kafka: Kafka, tmp_path: Path) -> None:
    from relay_storelog.store import StoreLog, StoreLogSettings
    from tests.storelog import script

    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    for i in range(3):
        script.apply(store, i)
    store.close()
    (log,) = (tmp_path / "store").glob("store-*.log")
    data = bytearray(log.read_bytes())
    data[data.index(b"\n") + 5] ^= 0x01  # inside the second of three lines
    log.write_bytes(bytes(data))
    env = {**kafka.env(), "RELAY_DATA__DIR": str(tmp_path)}
    result = _run("relay-queue-writer", RELAY_HTTP__PORT="0", **env)
    _assert_one_line(
        result,
        exits.EXIT_CONFIG,
        f"store log: {log.name} line 2: checksum mismatch; "
        "RELAY_STORE_REPAIR=true starts anyway, skipping it",
    )
    with helpers.running_service("relay-queue-writer", RELAY_STORE_REPAIR="true", **env):
        pass
    repaired = StoreLog(StoreLogSettings(root=tmp_path / "store"))  # the next start is clean
    assert sorted(repaired.queues) == ["r00000", "r00002"]
    repaired.close()
