"""Preparing an Apache Kafka node's log dir: formatted once, for the cluster recorded beside it;
anything else is refused with one line before a JVM starts the broker."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from relayctl import kafka_broker, kafka_classes
from tests import helpers


def _node(tmp_path: Path, node_id: int = 1) -> kafka_broker.Node:
    return kafka_broker.Node(node_id, "127.0.0.1", 9092, 9093, tmp_path / "kafka")


def test_a_new_log_dir_is_formatted_once_even_for_an_id_that_looks_like_an_option(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    cluster_id = "-" + kafka_broker.new_cluster_id()[1:]  # 1 in 64 random ids begins so
    command = kafka_broker.prepare(node, [node], cluster_id)
    assert command[-2:] == ["kafka.Kafka", str(node.config_dir / "server.properties")]
    meta = (node.log_dir / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}" in meta
    assert node.cluster_id_path.read_text().strip() == cluster_id
    before = (node.log_dir / "meta.properties").stat().st_mtime_ns
    kafka_broker.prepare(node, [node])  # again: kept, not formatted a second time
    assert (node.log_dir / "meta.properties").stat().st_mtime_ns == before


def test_a_log_dir_of_another_cluster_or_node_is_refused(tmp_path: Path) -> None:
    node = _node(tmp_path)
    kafka_broker.prepare(node, [node])
    node.cluster_id_path.write_text("AAAAAAAAAAAAAAAAAAAAAA\n")
    with pytest.raises(kafka_broker.KafkaSetupError, match="was formatted for Kafka cluster"):
        kafka_broker.prepare(node, [node])
    node.cluster_id_path.unlink()
    with pytest.raises(kafka_broker.KafkaSetupError, match=r"\(none recorded\)"):
        kafka_broker.prepare(node, [node])
    other = _node(tmp_path, node_id=2)
    meta = (node.log_dir / "meta.properties").read_text()
    cluster_id = next(line for line in meta.splitlines() if line.startswith("cluster.id="))
    with pytest.raises(kafka_broker.KafkaSetupError, match="belongs to Kafka node 1, not node 2"):
        kafka_broker.prepare(other, [other], cluster_id.split("=", 1)[1])


def test_a_non_empty_unformatted_dir_is_refused(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.log_dir.mkdir()
    (node.log_dir / "something").write_text("x")
    with pytest.raises(kafka_broker.KafkaSetupError, match="holds files but no Kafka"):
        kafka_broker.prepare(node, [node])


def test_three_voters_replicate_three_ways_with_two_in_sync() -> None:
    nodes = [
        kafka_broker.Node(n, "127.0.0.1", 9000 + n, 9100 + n, Path(f"/k{n}")) for n in (1, 2, 3)
    ]
    lines = dict(
        line.split("=", 1) for line in kafka_broker.properties(nodes[1], nodes).splitlines()
    )
    assert lines["controller.quorum.voters"] == (
        "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    )
    assert lines["node.id"] == "2"
    assert lines["default.replication.factor"] == "3"
    assert lines["min.insync.replicas"] == "2"
    assert lines["auto.create.topics.enable"] == "false"


def test_a_port_taken_before_the_node_binds_it_is_recognised_and_avoided(tmp_path: Path) -> None:
    cluster = helpers.KafkaCluster(tmp_path)
    taken = cluster.nodes[0].port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        try:
            cluster.start()  # fails to bind, says so, starts again on fresh ports
            assert cluster.nodes[0].port != taken
            assert kafka_broker.failed_to_bind(cluster.log_path(1).read_text())
        finally:
            cluster.kill()


def test_kafka_opts_reach_the_brokers_jvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`KAFKA_OPTS`, as Kafka's own scripts read it: extra JVM options before the main class
    (the test suite's brokers, short-lived, run on the C1 compiler only: `tests/conftest.py`)."""
    node = _node(tmp_path)
    monkeypatch.setenv("KAFKA_OPTS", "-XX:TieredStopAtLevel=1  -Dkafka.test='a b'")
    command = kafka_broker.prepare(node, [node])
    main = command.index("kafka.Kafka")
    assert command[main - 4 : main - 2] == ["-XX:TieredStopAtLevel=1", "-Dkafka.test=a b"]
    monkeypatch.delenv("KAFKA_OPTS")
    assert "-XX:TieredStopAtLevel=1" not in kafka_broker.prepare(node, [node])


def test_a_node_loads_its_classes_from_the_archive_setup_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./dev setup` makes the broker's class archive (`relayctl.kafka_classes`); a node's JVM
    maps it and loads the broker's classes from it, not from the jars."""
    assert kafka_classes.current(), "no class archive made by this Java: ./dev setup makes it"
    loaded = tmp_path / "loaded.txt"
    monkeypatch.setenv("KAFKA_OPTS", f"-Xlog:class+load=info:file={loaded}")
    cluster = helpers.KafkaCluster(tmp_path / "cluster")
    cluster.start()
    cluster.kill()
    server = [line for line in loaded.read_text().splitlines() if " kafka.Kafka " in line]
    assert server, "the node's JVM logged no class loads"
    assert server[0].endswith("source: shared objects file (top)"), server[0]


def test_an_archive_of_another_size_than_recorded_is_never_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated archive crashes a JDK 17 JVM that maps it (SIGBUS: it checks the header,
    not the length); a node is given the archive only at the size recorded once it was whole."""
    monkeypatch.setenv("RELAY_KAFKA_JARS", str(tmp_path / "jars"))
    archive, record = kafka_broker.class_archive(), kafka_broker.class_archive_record()
    archive.write_bytes(b"\0" * 100)
    assert kafka_broker.class_archive_options() == []  # no record: being made, or never
    record.write_text(json.dumps({"size": 100, "java": "the Java that made it"}))
    assert kafka_broker.class_archive_options() == [f"-XX:SharedArchiveFile={archive}"]
    archive.write_bytes(b"\0" * 60)
    assert kafka_broker.class_archive_options() == []
    record.write_text("{not json")
    assert kafka_broker.class_archive_options() == []
