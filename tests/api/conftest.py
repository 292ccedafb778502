from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests import helpers


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, shared_kafka: helpers.KafkaCluster
) -> Iterator[helpers.Running]:
    """One suite for the module, with WebSocket limits low enough to test."""
    with helpers.suite(
        tmp_path_factory.mktemp("suite"),
        "--port",
        str(helpers.free_port()),
        RELAY_WS_FRAMES_PER_S="20",
        RELAY_WS_FRAME_BURST="40",
        RELAY_WS_CONNECTIONS_PER_ADDRESS="8",
        kafka=helpers.Kafka.fresh(shared_kafka),
    ) as running:
        yield running


@pytest.fixture
def http(running: helpers.Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.state.ingress_url, timeout=20) as client:
        yield client


@pytest.fixture
def admin(running: helpers.Running) -> Iterator[httpx.Client]:
    """A client sending the admin token (for whichever suite the module runs)."""
    with httpx.Client(
        base_url=running.state.ingress_url,
        timeout=20,
        headers={"Authorization": f"Bearer {running.token()}"},
    ) as client:
        yield client


@pytest.fixture
def ws_url(running: helpers.Running) -> str:
    return running.state.ingress_url.replace("http://", "ws://") + "/v1/ws"
