"""`relayctl up`: Apache Kafka (or an existing cluster), embedded Redis and every service as
local processes.

Invariants:
- the ready line is printed only when every service's `/readyz` is green and an admin ping has
  travelled through all five services;
- a child that exits during start stops the whole suite, and relayctl exits 1 naming it and
  quoting its last log line (its one-line error);
- the broker keeps its log under `<data-dir>/kafka/` (formatted on first start, refused if it
  belongs to another cluster), so a restart on the same data dir keeps topics, records and
  committed offsets; with `--kafka` no broker is started and the services use that cluster;
- after start, a child that exits is restarted (the broker on its old ports): at once the first
  time within a minute (as the kubelet restarts a container), then with back-off; one that fails
  5 times within a minute stops the suite;
- SIGINT or SIGTERM stops the services (SIGTERM, 10 s grace, then SIGKILL), then Redis and the
  broker, and removes the run-state file: no child outlives relayctl.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx

from relayctl import embedded, kafka_broker, preload, processes, state

SERVICES = ("queue-writer", "delivery", "retainer", "replicator", "archiver", "ingress")
"""Start order; all start at once, ingress last so its port opens when the rest are starting.
The archiver is not on the ping's path (it only reads); its readiness is waited for all the same."""
GRACE_S = 10.0
INFRASTRUCTURE_BUDGET_S = 30.0
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
SUPERVISE_TICK_S = 0.05
"""How often exited children are looked for (a restart follows within one tick)."""


@dataclass(frozen=True)
class Options:
    data_dir: Path
    host: str
    port: int
    counts: dict[str, int]
    partitions: int
    ready_timeout_s: float
    kafka: str | None = None
    """Bootstrap servers of an existing cluster; None starts the embedded broker."""


class SuiteFailedError(Exception):
    pass


class _StopRequestedError(Exception):
    pass


def _on_signal(signum: int, _: FrameType | None) -> None:
    raise _StopRequestedError(signal.Signals(signum).name)


class Suite:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.data_dir = options.data_dir.resolve()
        self.logs = self.data_dir / "logs"
        self.token = state.admin_token(self.data_dir)
        host = options.host
        self.broker: processes.Child | None = None
        self.kafka_node: kafka_broker.Node | None = None
        if options.kafka is None:
            self.kafka_node = kafka_broker.Node(
                1,
                host,
                processes.free_port(host),
                processes.free_port(host),
                self.data_dir / "kafka",
            )
            self.broker = processes.Child(
                "broker",
                [],
                {},
                self.logs / "broker.log",
                self.kafka_node.port,
                ready_text=kafka_broker.READY_TEXT,
            )
        self.bootstrap = options.kafka or self.kafka_node.bootstrap  # type: ignore[union-attr]
        self.redis = processes.Child(
            "redis", [], {}, self.logs / "redis.log", processes.free_port(host)
        )
        (self.data_dir / "redis").mkdir(parents=True, exist_ok=True)
        self.redis.command = embedded.redis_command(host, self.redis.port, self.data_dir / "redis")
        instances = [(name, k) for name in SERVICES for k in range(options.counts[name])]
        self.services = [self._service(name, k) for name, k in instances]
        self.kinds = {
            child.name: name for child, (name, _) in zip(self.services, instances, strict=True)
        }
        """Each service instance's service."""
        replicators = [c for c in self.services if c.name.startswith("relay-replicator-")]
        peers = json.dumps([f"http://{host}:{c.port}" for c in replicators])
        for child in replicators:  # each learns the others' site ids from these
            child.env["RELAY_KV__PEERS"] = peers
        for child in self.services:  # retainers read their /ds targets from the replicators
            if child.name.startswith("relay-retainer-"):
                child.env.setdefault("RELAY_RETAINED__REPLICATORS", peers)
        first_ingress = next(c for c in self.services if c.name == "relay-ingress-0")
        self.ingress_url = f"http://{host}:{first_ingress.port}"

    @property
    def infrastructure(self) -> list[processes.Child]:
        return [c for c in (self.broker, self.redis) if c is not None]

    @property
    def children(self) -> list[processes.Child]:
        return [*self.infrastructure, *self.services]

    def _ingress_port(self, k: int) -> int:
        return (
            self.options.port + k if self.options.port else processes.free_port(self.options.host)
        )

    def _service(self, service: str, k: int) -> processes.Child:
        host = self.options.host
        port = self._ingress_port(k) if service == "ingress" else processes.free_port(host)
        replicas = self.options.counts[service]
        env = {
            **os.environ,
            "RELAY_INSTANCE": f"{service}-{k}",
            "RELAY_HTTP__HOST": host,
            "RELAY_HTTP__PORT": str(port),
            "RELAY_ADMIN_TOKEN": self.token,
            "RELAY_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "RELAY_KAFKA__PARTITIONS": str(self.options.partitions),
            "RELAY_REDIS_URL": f"redis://{host}:{self.redis.port}/0",
            "RELAY_DATA__DIR": str(self.data_dir / f"{service}-{k}"),
            "RELAY_DATA__ORDINAL": str(k),
            "RELAY_DATA__REPLICAS": str(replicas),
        }
        if service == "archiver":
            env["RELAY_ARCHIVE__LOCATION"] = str(self.data_dir / "archive")
        executable = Path(sys.executable).parent / f"relay-{service}"
        return processes.Child(
            f"relay-{service}-{k}",
            [str(executable)],
            env,
            self.logs / f"{service}-{k}.log",
            port,
            probe_url=f"http://{host}:{port}/readyz",
        )

    # -- running ---------------------------------------------------------------------------

    def run(self) -> int:
        previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            started = time.monotonic()
            self._start_infrastructure()
            for child in self.services:
                child.start()
            self._write_state()
            self._wait_ready(started)
            total_ms = self._ping()
            print(
                f"Relay ready at {self.ingress_url} in {time.monotonic() - started:.1f} s: "
                f"{len(self.services)} service processes, ping {total_ms:.0f} ms through all "
                f"five; admin token in {self.data_dir / 'admin-token'}; logs in {self.logs}; "
                "Ctrl-C stops",
                flush=True,
            )
            self._supervise()
        except _StopRequestedError:
            pass
        except SuiteFailedError as error:
            print(f"relayctl: {error}", file=sys.stderr, flush=True)
            code = 1
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _start_infrastructure(self) -> None:
        self._prepare_broker()
        for child in self.infrastructure:
            child.start()
        self._load_services()  # while the broker starts
        deadline = time.monotonic() + INFRASTRUCTURE_BUDGET_S
        for child in self.infrastructure:
            while not (processes.port_open(self.options.host, child.port) and child.logged_ready()):
                if child is self.broker and self._broker_lost_a_port_race():
                    continue
                self._check_alive(child)
                if time.monotonic() > deadline:
                    raise SuiteFailedError(
                        f"{child.name} was not serving on port {child.port} within "
                        f"{INFRASTRUCTURE_BUDGET_S:g} s; see {child.log_path}"
                    )
                time.sleep(0.05)

    def _load_services(self) -> None:
        try:
            loaded = preload.load_all(SERVICES)
        except (LookupError, ImportError) as error:
            raise SuiteFailedError(f"the services could not be imported: {error}") from None
        for child in self.services:
            child.service = loaded[self.kinds[child.name]]

    def _prepare_broker(self) -> None:
        if self.broker is not None and self.kafka_node is not None:
            try:
                self.broker.command = kafka_broker.prepare(self.kafka_node, [self.kafka_node])
            except kafka_broker.KafkaSetupError as error:
                raise SuiteFailedError(str(error)) from None

    def _broker_lost_a_port_race(self) -> bool:
        """The broker exited because a port picked as free was taken before it bound it: start
        it again on fresh ports (the services, not started yet, get the new address)."""
        broker, node = self.broker, self.kafka_node
        assert broker is not None
        assert node is not None
        if broker.exit_code() is None or len(broker.restarts) >= 3:
            return False
        if not kafka_broker.failed_to_bind(broker.log_since_start()):
            return False
        host = self.options.host
        self.kafka_node = dataclasses.replace(
            node, port=processes.free_port(host), controller_port=processes.free_port(host)
        )
        broker.port = self.kafka_node.port
        broker.restarts.append(time.monotonic())
        self.bootstrap = self.kafka_node.bootstrap
        for service in self.services:
            service.env["RELAY_KAFKA__BOOTSTRAP_SERVERS"] = self.bootstrap
        self._prepare_broker()
        broker.start()
        return True

    def _check_alive(self, child: processes.Child) -> None:
        code = child.exit_code()
        if code is not None:
            raise SuiteFailedError(
                f"{child.name} exited with code {code} during start: {child.last_log_line()}"
            )

    def _wait_ready(self, started: float) -> None:
        deadline = started + self.options.ready_timeout_s
        waiting = list(self.services)
        with httpx.Client(timeout=1.0) as http:
            while waiting:
                for child in self.children:
                    self._check_alive(child)
                for child in list(waiting):
                    assert child.probe_url is not None
                    try:
                        if http.get(child.probe_url).status_code == 200:
                            waiting.remove(child)
                    except httpx.HTTPError:
                        pass
                if waiting and time.monotonic() > deadline:
                    names = ", ".join(child.name for child in waiting)
                    raise SuiteFailedError(
                        f"not ready within {self.options.ready_timeout_s:g} s: {names}"
                    )
                time.sleep(0.1)

    def _ping(self) -> float:
        response = httpx.get(
            f"{self.ingress_url}/admin/ping",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=15,
        )
        if response.status_code != 200:
            raise SuiteFailedError(
                f"the start-up ping failed: {response.status_code} {response.text}"
            )
        total: float = response.json()["total_ms"]
        return total

    def _supervise(self) -> None:
        due: dict[str, float] = {}
        while True:
            time.sleep(SUPERVISE_TICK_S)
            now = time.monotonic()
            for child in self.children:
                code = child.exit_code()
                if code is None:
                    continue
                if child.name not in due:
                    child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_S]
                    if len(child.restarts) >= RESTART_LIMIT:
                        raise SuiteFailedError(
                            f"{child.name} exited {RESTART_LIMIT + 1} times within "
                            f"{RESTART_WINDOW_S:g} s; last: {child.last_log_line()}"
                        )
                    tries = len(child.restarts)
                    delay = 0.0 if tries == 0 else min(5.0, 0.25 * 2 ** (tries - 1))
                    due[child.name] = now + delay
                    print(
                        f"relayctl: {child.name} exited with code {code};"
                        f" restarting in {delay:g} s",
                        file=sys.stderr,
                        flush=True,
                    )
                elif now >= due[child.name]:
                    del due[child.name]
                    child.restarts.append(now)
                    child.start()
                    self._write_state()

    def _stop(self) -> None:
        processes.stop_all(self.services, GRACE_S)
        processes.stop_all(self.infrastructure, GRACE_S)
        state.remove_state(self.data_dir)

    def _write_state(self) -> None:
        state.write_state(
            self.data_dir,
            state.SuiteState(
                pid=os.getpid(),
                ingress_url=self.ingress_url,
                kafka=self.bootstrap,
                topic_prefix=os.environ.get("RELAY_KAFKA__TOPIC_PREFIX", ""),
                children=[
                    state.ChildState(name=c.name, pid=c.pid, port=c.port, probe_url=c.probe_url)
                    for c in self.children
                ],
            ),
        )
