from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers

# The suite's brokers live seconds to minutes: the C2 compiler's warm-up was most of a fresh
# broker's CPU (decision 0013), and C1 alone costs a third less there. Every broker a test
# starts, in this process or through `relayctl`, reads it (`relayctl.kafka_broker.prepare`).
os.environ.setdefault("KAFKA_OPTS", "-XX:TieredStopAtLevel=1")
# Likewise the Spark driver's JVM (every session a test starts, in this process or through
# `relayctl` and `relay-spark`): a session and a small job took 21.7 s of CPU with C2 and 12.5 s
# with C1 alone here. PySpark passes these arguments to spark-submit; `pyspark-shell` ends them.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", "--driver-java-options=-XX:TieredStopAtLevel=1 pyspark-shell"
)


@pytest.fixture(scope="session")
def shared_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helpers.KafkaCluster]:
    """One Apache Kafka node per test process (per xdist worker), shared through prefixes."""
    with helpers.kafka_cluster(tmp_path_factory.mktemp("kafka")) as cluster:
        yield cluster


@pytest.fixture
def kafka(shared_kafka: helpers.KafkaCluster) -> helpers.Kafka:
    """The shared broker under a topic prefix of this test's own."""
    return helpers.Kafka.fresh(shared_kafka)


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[helpers.Kafka]:
    """A broker of this test's own, for tests that kill or wipe it."""
    with helpers.kafka_cluster(tmp_path / "kafka") as cluster:
        yield helpers.Kafka(cluster)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with helpers.redis_server(tmp_path) as url:
        yield url
