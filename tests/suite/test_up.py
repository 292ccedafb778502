"""End to end: the whole suite through the README's entry point, the way a developer runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from relayctl import state
from tests.helpers import BIN, ROOT, Running, alive, free_port, port_free, service_env, suite

pytestmark = pytest.mark.suite

SERVICES = ["queue-writer", "delivery", "retainer", "replicator", "ingress"]


def _assert_stops_cleanly(running: Running, sig: signal.Signals = signal.SIGTERM) -> None:
    running.collect_descendants()
    ports = [child.port for child in running.state.children]
    assert len(running.descendants) >= 8  # broker, redis, five services and the archiver
    running.process.send_signal(sig)
    assert running.process.wait(timeout=25) == 0
    assert not [pid for pid in running.descendants if alive(pid)]
    assert all(port_free(port) for port in ports)
    assert state.read_state(running.data_dir) is None


def test_readme_entry_point_starts_pings_and_stops_cleanly(tmp_path: Path) -> None:
    with suite(tmp_path, "--port", str(free_port()), entry=[str(ROOT / "dev"), "up"]) as running:
        assert "ping" in running.ready_line
        ready_s = float(running.ready_line.split(" in ", 1)[1].split(" s:", 1)[0])
        assert ready_s < 30, running.ready_line  # Apache Kafka included, on 2 cores
        response = running.ping()
        assert response.status_code == 200, response.text
        report = response.json()
        assert [hop["service"] for hop in report["hops"]] == SERVICES
        assert all(hop["latency_ms"] >= 0 for hop in report["hops"])
        assert report["total_ms"] >= sum(hop["latency_ms"] for hop in report["hops"]) - 1

        status = subprocess.run(
            [str(BIN / "relayctl"), "status", "--data-dir", str(running.data_dir)],
            capture_output=True,
            text=True,
            check=False,
            env=service_env(),
        )
        assert status.returncode == 0, status.stdout
        for name in ["broker", "redis", "relay-archiver-0", *(f"relay-{s}-0" for s in SERVICES)]:
            assert name in status.stdout

        wrong = httpx.get(
            f"{running.state.ingress_url}/admin/ping", headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 403
        assert wrong.json()["error"] == "FORBIDDEN"
        _assert_stops_cleanly(running)


def _dump_everywhere(running: Running) -> None:
    """`relayctl dump --wait` reaches both queue-writers, which split the 8 partitions."""
    result = subprocess.run(
        [str(BIN / "relayctl"), "dump", "--wait", "--data-dir", str(running.data_dir)],
        capture_output=True,
        text=True,
        check=False,
        env=service_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "finished: dump" in result.stdout
    for k, partitions in ((0, "0,2,4,6"), (1, "1,3,5,7")):
        assert f"queue-writer-{k}" in result.stdout
        assert partitions in result.stdout
        assert list((running.data_dir / f"queue-writer-{k}" / "store").glob("store-*.dump"))
    started = httpx.post(
        f"{running.state.ingress_url}/admin/dump",
        headers={"Authorization": f"Bearer {running.token()}"},
        timeout=30,
    )
    assert started.status_code == 202, started.text
    writers = started.json()["writers"]
    assert sorted(p for w in writers for p in w["partitions"]) == list(range(8))


def test_several_instances_dump_and_survive_broker_loss(tmp_path: Path) -> None:
    args = [
        "--port",
        "0",
        "--ingress",
        "2",
        "--queue-writers",
        "2",
        "--retainers",
        "2",
        "--delivery",
        "2",
    ]
    with suite(tmp_path, *args) as running:
        second_ingress = running.ingress_urls()[1]
        # Pings take random partitions: several cover both queue-writers' shares.
        for url in (None, second_ingress, None, second_ingress):
            assert running.ping(url).status_code == 200
        _dump_everywhere(running)
        broker = next(c for c in running.state.children if c.name == "broker")
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while True:
            assert time.monotonic() - killed_at < 30, "no ping within 30 s of the broker loss"
            try:
                if running.ping(timeout_s=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert running.state.children[0].pid != broker.pid  # relayctl restarted it
        assert running.ping(second_ingress).status_code == 200
        _assert_stops_cleanly(running, signal.SIGINT)  # what Ctrl-C sends


def test_a_child_dying_at_start_stops_the_suite_and_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = subprocess.Popen(
            [str(BIN / "relayctl"), "up", "--data-dir", str(tmp_path / "var"), "--port", str(port)],
            env=service_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: set[int] = set()
        while process.poll() is None:
            try:
                seen |= {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "relay-ingress-0 exited with code 71 during start" in stderr
    assert f"port {port} on 127.0.0.1 is in use" in stderr
    assert seen
    # relayctl waited for its children; a grandchild (a service's fork server) ends when its
    # parent has, a moment later: none may stay.
    deadline = time.monotonic() + 10
    while [pid for pid in seen if alive(pid)]:
        assert time.monotonic() < deadline, [pid for pid in seen if alive(pid)]
        time.sleep(0.1)


def test_killing_relayctl_leaves_no_orphans(tmp_path: Path) -> None:
    # --port 0 (any free port): regression, the ready line's URL once named another free port.
    with suite(tmp_path, "--port", "0") as running:
        running.collect_descendants()
        running.process.send_signal(signal.SIGKILL)
        running.process.wait()
        deadline = time.monotonic() + 10
        while [pid for pid in running.descendants if alive(pid)]:
            assert time.monotonic() < deadline, "children outlived relayctl"
            time.sleep(0.1)
