"""Test helpers: real embedded broker and Redis processes on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from relayctl import embedded, state

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open")


def port_free(port: int) -> bool:
    """Nothing listens on `port` (connections left in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Broker:
    """The embedded Kafka-protocol broker on a fixed port, restartable (losing everything)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        for _ in range(50):
            self.process = subprocess.Popen(
                embedded.broker_command("127.0.0.1", self.port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_port(self.port, 2)
                return
            except TimeoutError:
                self.process.kill()
                self.process.wait()
        raise RuntimeError("broker did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None


@contextmanager
def broker() -> Iterator[Broker]:
    b = Broker()
    b.start()
    try:
        yield b
    finally:
        b.kill()


@contextmanager
def redis_server(tmp: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        embedded.redis_command("127.0.0.1", port, tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


def service_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(overrides)
    return env


@contextmanager
def running_service(script: str, ready_timeout_s: float = 30, **env: str) -> Iterator[str]:
    """Start a service's console script on a free port; yield its URL once `/readyz` is 200.
    Stops it with SIGTERM (and checks it exits 0) when the block ends."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / script)],
        env=service_env(RELAY_HTTP__PORT=str(port), RELAY_INSTANCE=script, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{script} exited: {process.communicate()[1][-2000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{script} not ready in {ready_timeout_s} s")
            time.sleep(0.1)
        yield url
        process.terminate()
        _, stderr = process.communicate(timeout=15)
        assert process.returncode == 0, stderr[-2000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


READY_BUDGET_S = 60.0


@dataclass
class Running:
    process: subprocess.Popen[str]
    data_dir: Path
    ready_line: str
    descendants: set[int] = field(default_factory=set)

    def ingress_urls(self) -> list[str]:
        """Every ingress instance's URL, in instance order (from relayctl's run state)."""
        return [
            f"http://127.0.0.1:{child.port}"
            for child in self.state.children
            if child.name.startswith("relay-ingress-")
        ]

    @property
    def state(self) -> state.SuiteState:
        found = state.read_state(self.data_dir)
        assert found is not None
        return found

    def token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def ping(self, url: str | None = None, timeout_s: float = 15) -> httpx.Response:
        return httpx.get(
            f"{url or self.state.ingress_url}/admin/ping",
            headers={"Authorization": f"Bearer {self.token()}"},
            timeout=timeout_s,
        )

    def collect_descendants(self) -> None:
        self.descendants |= {
            p.pid for p in psutil.Process(self.process.pid).children(recursive=True)
        }


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextmanager
def suite(
    tmp_path: Path, *args: str, entry: list[str] | None = None, **env: str
) -> Iterator[Running]:
    """`relayctl up` (or `entry`) with data under `tmp_path`; yields once its ready line is out.
    `env` goes to every service (settings such as RELAY_WS_FRAMES_PER_S)."""
    data_dir = tmp_path / "var"
    command = [*(entry or [str(BIN / "relayctl"), "up"]), "--data-dir", str(data_dir), *args]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=service_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    running = Running(process, data_dir, "")
    try:
        started = time.monotonic()
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("Relay ready at "):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)  # the exit code and stderr, not a race with the reaping
            stderr = process.stderr.read() if process.returncode is not None else ""
            raise AssertionError(f"no ready line: {line!r}, exit {process.returncode}: {stderr}")
        assert time.monotonic() - started < READY_BUDGET_S
        running.ready_line = line
        running.collect_descendants()
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def kill_when_acked(module: str, *args: str, count: int) -> int:
    """Run `python -m module args` (a crash-test child printing its acknowledged count, one per
    line), SIGKILL it once it has printed `count`, and return the last count it printed."""
    child = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    acked = 0
    for line in child.stdout:
        acked = int(line)
        if acked >= count:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    return acked
