"""Test helpers: real Apache Kafka and Redis processes on free loopback ports."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from relay_bus import schemas
from relay_bus.config import KafkaSettings
from relayctl import embedded, kafka_broker, processes, state
from tests import launcher

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A free port on 127.0.0.1, below the ephemeral range (as `relayctl up` picks them)."""
    return processes.free_port("127.0.0.1")


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


class PortTakenError(RuntimeError):
    pass


class KafkaCluster:
    """Apache Kafka nodes (one, or three for replication) from the pinned jars, under `root`,
    on fixed loopback ports: a node can be SIGKILLed and started again on the same ports with
    its log, or wiped (its log lost, as when a volume is replaced)."""

    def __init__(self, root: Path, nodes: int = 1) -> None:
        self.root = root
        self.nodes = [
            kafka_broker.Node(n, "127.0.0.1", free_port(), free_port(), root / f"kafka-{n}")
            for n in range(1, nodes + 1)
        ]
        self.cluster_id = kafka_broker.new_cluster_id()
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def log_path(self, node_id: int) -> Path:
        return self.root / f"kafka-{node_id}.log"

    def start(self, *node_ids: int, timeout_s: float = 60.0) -> None:
        """Start the given nodes (all by default) and wait until each serves. A first start
        that loses a port race (another process took a port between our pick and the node's
        bind) starts every node again on fresh ports."""
        for attempt in range(3):
            try:
                self._start(*node_ids, timeout_s=timeout_s)
                return
            except PortTakenError:
                if node_ids or attempt == 2:
                    raise
                self.kill()
                self.nodes = [
                    dataclasses.replace(node, port=free_port(), controller_port=free_port())
                    for node in self.nodes
                ]

    def _start(self, *node_ids: int, timeout_s: float) -> None:
        chosen = [n for n in self.nodes if not node_ids or n.node_id in node_ids]
        offsets = {}
        for node in chosen:
            command = kafka_broker.prepare(node, self.nodes, self.cluster_id)
            log_path = self.log_path(node.node_id)
            with log_path.open("ab") as log:
                offsets[node.node_id] = log.tell()
                self.processes[node.node_id] = subprocess.Popen(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=processes.die_with_parent,  # noqa: PLW1509
                )
        deadline = time.monotonic() + timeout_s
        for node in chosen:
            while not self._logged_ready(node.node_id, offsets[node.node_id]):
                process = self.processes[node.node_id]
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_path(node.node_id).read_text(errors="replace")[-3000:]
                    error = PortTakenError if kafka_broker.failed_to_bind(tail) else RuntimeError
                    raise error(f"Kafka node {node.node_id} did not start:\n{tail}")
                time.sleep(0.05)

    def _logged_ready(self, node_id: int, offset: int) -> bool:
        with self.log_path(node_id).open("rb") as log:
            log.seek(offset)
            return kafka_broker.READY_TEXT.encode() in log.read()

    def kill(self, *node_ids: int) -> None:
        """SIGKILL the given nodes (all by default)."""
        for node_id in node_ids or list(self.processes):
            process = self.processes.pop(node_id, None)
            if process is not None:
                process.kill()
                process.wait()

    def wipe(self) -> None:
        """Kill every node and lose every log; the next start formats a new cluster."""
        self.kill()
        for node in self.nodes:
            shutil.rmtree(node.log_dir, ignore_errors=True)
            node.cluster_id_path.unlink(missing_ok=True)
        self.cluster_id = kafka_broker.new_cluster_id()


@contextmanager
def kafka_cluster(root: Path, nodes: int = 1) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(root, nodes)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.kill()


@dataclass
class Kafka:
    """What a test gets from a Kafka fixture: a cluster and the topic prefix its services use
    (a shared cluster gives each test its own prefix, so tests never see each other's records,
    consumer groups or epochs)."""

    cluster: KafkaCluster
    prefix: str = ""

    @classmethod
    def fresh(cls, cluster: KafkaCluster) -> Kafka:
        """`cluster` under a prefix no other test uses."""
        return cls(cluster, f"t{uuid.uuid4().hex[:12]}.")

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def settings(self, **extra: Any) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.bootstrap, topic_prefix=self.prefix, **extra)

    def env(self) -> dict[str, str]:
        """The service environment variables that point at this cluster and prefix."""
        return {
            "RELAY_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "RELAY_KAFKA__TOPIC_PREFIX": self.prefix,
        }

    def kill(self) -> None:
        self.cluster.kill()

    def start(self) -> None:
        self.cluster.start()


@dataclass
class RecordingBus:
    """Stands in for `relay_bus.bus.Bus` where a service's handler hands records on, for
    in-process tests of the handlers (the suite tests cross real Kafka)."""

    epoch: str = "epoch-1"
    end: int = 0
    """What `end_offsets` answers for every partition."""
    posted: list[tuple[str, schemas.Record, int | None]] = field(default_factory=list)

    def post(self, topic: str, record: schemas.Record, *, partition: int | None = None) -> None:
        schemas.check_topic(record, topic)
        self.posted.append((topic, record, partition))

    async def send(
        self, topic: str, record: schemas.Record, *, partition: int | None = None
    ) -> tuple[int, int]:
        self.post(topic, record, partition=partition)
        return partition or 0, len(self.posted) - 1

    async def end_offsets(self, topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, self.end)

    def replies(self) -> dict[str, schemas.QueueReply]:
        return {r.id: r for _, r, _ in self.posted if isinstance(r, schemas.QueueReply)}

    def ds_replies(self, request_id: str) -> list[tuple[schemas.DsReply, int | None]]:
        """The `ds_reply` records answering `request_id` (only ever posted to
        `relay.ingress.inbox`, `post` checks), in the order posted, each with its partition."""
        return [
            (r, part)
            for _, r, part in self.posted
            if isinstance(r, schemas.DsReply) and r.id == request_id
        ]


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


def start_service(script: str, env: dict[str, str], log: Path) -> processes.Forked:
    """A service instance started as `relayctl up` starts one (`tests.launcher`), running
    what `script` runs with exactly `env`, its stdout and stderr appended to `log`. A test of
    the console script itself (its start errors, its exit codes) executes it instead."""
    return launcher.start(BIN / script, env, log)


def service_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(overrides)
    return env


@contextmanager
def running_service(
    script: str, ready_timeout_s: float = 30, log: Path | None = None, **env: str
) -> Iterator[str]:
    """Start a service (`start_service`) on a free port; yield its URL once `/readyz` is 200.
    Stops it with SIGTERM (and checks it exits 0) when the block ends. Its log goes to `log`
    (emptied first), or to a temporary file: never a pipe nobody reads, which would stop the
    service at its 64 KiB-th byte of log."""
    port = free_port()
    with contextlib.ExitStack() as stack:
        if log is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / f"{script}.log"
        log.write_bytes(b"")
        process = start_service(
            script,
            service_env(**{"RELAY_HTTP__PORT": str(port), "RELAY_INSTANCE": script, **env}),
            log,
        )

        def tail() -> str:
            return log.read_bytes().decode(errors="replace")[-2000:]

        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{script} exited: {tail()}")
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
            assert process.wait(timeout=15) == 0, tail()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


READY_BUDGET_S = 60.0
"""How long a test waits for a suite's ready line (several instances, another suite beside it).
The default start's own promise (30 s) is checked by `tests/suite/test_up.py`."""


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
    tmp_path: Path,
    *args: str,
    entry: list[str] | None = None,
    kafka: Kafka | None = None,
    **env: str,
) -> Iterator[Running]:
    """`relayctl up` (or `entry`) with data under `tmp_path`; yields once its ready line is out.
    `env` goes to every service (settings such as RELAY_WS_FRAMES_PER_S). With `kafka`, the
    suite uses that cluster under its prefix (`--kafka`) instead of a broker of its own: for
    tests that neither stop, kill nor measure the broker."""
    data_dir = tmp_path / "var"
    if kafka is not None:
        args = ("--kafka", kafka.bootstrap, *args)
        env = {**kafka.env(), **env}
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
            exited = process.returncode is not None
            stderr = process.stderr.read() if exited and process.stderr else ""
            raise AssertionError(f"no ready line: {line!r}, exit {process.returncode}: {stderr}")
        assert time.monotonic() - started < READY_BUDGET_S
        running.ready_line = line
        running.collect_descendants()
        yield running
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def child_command(module: str, *args: str) -> list[str]:
    """The command running a test's child module as a service starts (`tests/child.py`)."""
    return [sys.executable, "-m", "tests.child", module, *args]


def kill_when_acked(module: str, *args: str, count: int) -> int:
    """Run the child `module` with `args` (a crash-test child printing its acknowledged count,
    one per line), SIGKILL it once it has printed `count`, and return the last count it
    printed."""
    child = subprocess.Popen(
        child_command(module, *args), cwd=ROOT, stdout=subprocess.PIPE, text=True
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
