"""Apache Kafka nodes run from the pinned jars: one JVM per node, broker and controller (KRaft).

Invariants:
- a node's log dir is formatted once, for the cluster id recorded beside it
  (`<log dir>.cluster-id`); a log dir formatted for another cluster or another node id is refused
  with one line (`KafkaSetupError`), never started or reformatted;
- a node's configuration is written afresh at every start (ports may change between runs; the
  data does not depend on them), with everything that differs between a one-node and a
  three-node cluster derived from the voter list;
- nothing here keeps a process: callers start `command()` and wait for `READY_TEXT` in its log;
- a node's JVM maps the class archive `./dev setup` made (`relayctl.kafka_classes`) only when
  it is the size recorded beside it: a truncated archive crashes a JDK 17 JVM (it checks the
  header, not the length), and without the archive a node starts the same, only slower.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from relay_durable import codec

READY_TEXT = "Kafka Server started"
"""Logged (INFO, `kafka.server.KafkaRaftServer`) once the node serves clients; the port opens
earlier, so an open port is not readiness."""

HEAP = "512m"

BIND_FAILURES = ("Socket server failed to bind", "Unable to start acceptor")
"""Logged when a port chosen as free was taken before the node bound it: start again on others."""


def failed_to_bind(log_text: str) -> bool:
    return any(text in log_text for text in BIND_FAILURES)


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


class KafkaSetupError(Exception):
    """A node cannot be prepared; the message is one line for the user."""


@dataclass(frozen=True)
class Node:
    node_id: int
    host: str
    port: int
    """The client listener (PLAINTEXT)."""
    controller_port: int
    log_dir: Path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def cluster_id_path(self) -> Path:
        return self.log_dir.with_name(self.log_dir.name + ".cluster-id")

    @property
    def config_dir(self) -> Path:
        return self.log_dir.with_name(self.log_dir.name + ".config")


def jars_dir() -> Path:
    """The classpath folder `./dev setup` fills (`RELAY_KAFKA_JARS` overrides it)."""
    override = os.environ.get("RELAY_KAFKA_JARS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[4] / ".tools" / "kafka" / "jars"


def class_archive() -> Path:
    """Where `relayctl.kafka_classes` keeps the broker's class-data-sharing archive."""
    return jars_dir().parent / "classes.jsa"


def class_archive_record() -> Path:
    """The archive's size in bytes and the Java it was made by, written once it is whole."""
    return jars_dir().parent / "classes.json"


def class_archive_options() -> list[str]:
    archive = class_archive()
    try:
        recorded = json.loads(class_archive_record().read_text())["size"]
        whole = archive.stat().st_size == recorded
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [f"-XX:SharedArchiveFile={archive}"] if whole else []


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not Path(found).exists():
        raise KafkaSetupError("Java 17+ is needed to run Apache Kafka: no `java` on PATH")
    return found


def new_cluster_id() -> str:
    """16 random bytes, base64url without padding (what `kafka-storage random-uuid` prints)."""
    return codec.b64u(uuid.uuid4().bytes)


def properties(node: Node, voters: list[Node]) -> str:
    """server.properties of `node` in the cluster of `voters` (itself included)."""
    n = len(voters)
    replicas = min(n, 3)
    min_isr = 2 if replicas == 3 else 1
    lines = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{v.node_id}@{v.host}:{v.controller_port}" for v in voters
        ),
        "listeners": f"PLAINTEXT://{node.host}:{node.port},"
        f"CONTROLLER://{node.host}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{node.host}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.log_dir),
        # Relay creates its topics itself with their partition counts (relay_bus.topics).
        "auto.create.topics.enable": "false",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": "1" if n == 1 else "3",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.dedupe.buffer.size": "2097152",
        "num.network.threads": "2",
        "num.io.threads": "2",
        # A killed node is noticed within 3 s (default 9), which bounds how long acks=all
        # writes stall on the partitions it led.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def _meta(log_dir: Path) -> dict[str, str] | None:
    try:
        text = (log_dir / "meta.properties").read_text()
    except FileNotFoundError:
        return None
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def prepare(node: Node, voters: list[Node], cluster_id: str | None = None) -> list[str]:
    """Write `node`'s configuration, format its log dir if it is new, and return the command
    that starts it. A new log dir gets `cluster_id` (a fresh one if None); an existing one must
    carry the id recorded for it."""
    node.config_dir.mkdir(parents=True, exist_ok=True)
    config = node.config_dir / "server.properties"
    config.write_text(properties(node, voters))
    log4j = node.config_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    jars = jars_dir()
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise KafkaSetupError(f"Apache Kafka's jars are missing from {jars}: run ./dev setup")
    base = [
        java(),
        f"-Xms{HEAP}",
        f"-Xmx{HEAP}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        *class_archive_options(),
        *shlex.split(os.environ.get("KAFKA_OPTS", "")),
        "-cp",
        f"{jars}/*",
    ]
    meta = _meta(node.log_dir)
    if meta is None:
        if node.log_dir.exists() and any(node.log_dir.iterdir()):
            raise KafkaSetupError(
                f"{node.log_dir} holds files but no Kafka meta.properties: move it away"
            )
        cluster_id = cluster_id or new_cluster_id()
        _format(base, config, cluster_id)
        node.cluster_id_path.write_text(cluster_id + "\n")
    else:
        _check_formatted(node, meta, cluster_id)
    return [*base, "kafka.Kafka", str(config)]


def _check_formatted(node: Node, meta: dict[str, str], cluster_id: str | None) -> None:
    found = meta.get("cluster.id", "?")
    try:
        recorded = node.cluster_id_path.read_text().strip()
    except FileNotFoundError:
        recorded = None
    expected = cluster_id or recorded
    if expected is None or found != expected:
        raise KafkaSetupError(
            f"{node.log_dir} was formatted for Kafka cluster {found}, not this data dir's "
            f"cluster {expected or '(none recorded)'}: move it away or use another data dir"
        )
    if meta.get("node.id") != str(node.node_id):
        raise KafkaSetupError(
            f"{node.log_dir} belongs to Kafka node {meta.get('node.id')}, not node {node.node_id}"
        )


def _format(base: list[str], config: Path, cluster_id: str) -> None:
    # `=`: a base64url id may begin with "-", which would otherwise read as an option.
    command = [
        *base,
        "kafka.tools.StorageTool",
        "format",
        f"--cluster-id={cluster_id}",
        f"--config={config}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise KafkaSetupError(f"formatting Kafka failed: {lines[-1] if lines else done.returncode}")
