"""`kopf run` of the operator against the test API server and real Relay (`relayctl up`: Apache
Kafka, the embedded Redis, two queue-writers), its admin calls passing through a recording kmock
proxy: dumps on schedule and not early after an operator restart, DumpsHealthy naming the
partitions of a stuck queue-writer, and a RelayDsStorage reconciled to `PUT replicas`, a 400
included."""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from relay_operator import times
from tests import helpers
from tests.operator import kube
from tests.operator.conftest import NAMESPACE, Operator, wait_for

pytestmark = pytest.mark.suite

INTERVAL_S = 20
TIMEOUT_S = 8


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, shared_kafka: helpers.KafkaCluster
) -> Iterator[helpers.Running]:
    # The services' own dump timer is off, as the chart sets it when the operator is installed.
    with helpers.suite(
        tmp_path_factory.mktemp("suite"),
        "--port",
        str(helpers.free_port()),
        "--queue-writers",
        "2",
        RELAY_DUMP_INTERVAL_S="0",
        kafka=helpers.Kafka.fresh(shared_kafka),
    ) as running:
        yield running


@pytest.fixture
def relay(running: helpers.Running) -> Iterator[kube.Proxy]:
    with kube.proxy(running.state.ingress_url) as proxy:
        yield proxy


def install(api: kube.Served, running: helpers.Running, relay: kube.Proxy, **spec: Any) -> None:
    token = base64.b64encode(running.token().encode()).decode()
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "r1-relay-admin", "namespace": NAMESPACE},
            "data": {"token": token},
        }
    )
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayCluster",
            "metadata": {"name": "relay", "namespace": NAMESPACE},
            "spec": {
                "partitions": 8,
                "adminSecret": "r1-relay-admin",
                "adminUrl": relay.url,
                **spec,
            },
        }
    )


def cluster_status(api: kube.Served) -> dict[str, Any]:
    return dict((api.get("relayclusters", NAMESPACE, "relay") or {}).get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def ticks(op: Operator) -> int:
    return op.text().count("Timer 'dumps' succeeded")


def test_dumps_run_on_schedule_and_not_early_after_an_operator_restart(
    api: kube.Served,
    operator: Callable[..., Operator],
    running: helpers.Running,
    relay: kube.Proxy,
) -> None:
    install(api, running, relay, dumpIntervalSeconds=INTERVAL_S, dumpTimeoutSeconds=TIMEOUT_S)
    first_op = operator()
    wait_for(
        "the first dump",
        lambda: cluster_status(api).get("dumps", {}).get("lastSuccessAt"),
        operator=first_op,
    )
    dumps = cluster_status(api)["dumps"]
    first = dumps["dump"]
    assert sorted(p for w in dumps["writers"] for p in w["partitions"]) == list(range(8))
    assert len(dumps["writers"]) == 2
    assert all({"records", "bytes", "pauseMs", "totalSeconds"} <= set(w) for w in dumps["writers"])
    assert condition(cluster_status(api), "DumpsHealthy")["status"] == "True"
    started = times.parse(dumps["lastAttemptAt"])
    assert started is not None
    assert len(relay.sent("POST", "/admin/dump")) == 1

    # Kill the operator right after its dump and start another: kopf fires the new process's
    # timer at once, and the due time must come from the status, not from the process start.
    first_op.kill()
    second_op = operator()
    wait_for("the restarted operator's timer", lambda: ticks(second_op) >= 2, operator=second_op)
    wait_for(
        "the second dump",
        lambda: cluster_status(api).get("dumps", {}).get("dump", first) > first,
        timeout_s=INTERVAL_S * 4,
        operator=second_op,
    )
    second = cluster_status(api)["dumps"]["dump"]
    assert second == first + 1
    again = times.parse(cluster_status(api)["dumps"]["lastAttemptAt"])
    assert again is not None
    assert again - started >= INTERVAL_S
    assert len(relay.sent("POST", "/admin/dump")) == 2
    # The restarted process ticked (at once, and every second) before the due time came.
    assert ticks(second_op) >= 2

    # A queue-writer that does not answer (stopped, not dead: relayctl restarts the dead) is
    # named by its partitions; the dump figures of the last good dump stay.
    writer = next(c for c in running.state.children if c.name == "relay-queue-writer-1")
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        wait_for(
            "DumpsHealthy=False",
            lambda: condition(cluster_status(api), "DumpsHealthy").get("status") == "False",
            timeout_s=INTERVAL_S * 4,
            operator=second_op,
        )
    finally:
        os.kill(writer.pid, signal.SIGCONT)
    status = cluster_status(api)
    healthy = condition(status, "DumpsHealthy")
    assert healthy["reason"] == "PartitionsSilent"
    assert "[1, 3, 5, 7]" in healthy["message"]
    assert status["dumps"]["missingPartitions"] == [1, 3, 5, 7]
    assert status["dumps"]["dump"] == second


def test_a_ds_storage_is_put_to_relay_and_a_400_becomes_a_condition(
    api: kube.Served,
    operator: Callable[..., Operator],
    running: helpers.Running,
    relay: kube.Proxy,
) -> None:
    install(api, running, relay, dumpIntervalSeconds=0)
    headers = {"Authorization": f"Bearer {running.token()}"}
    sites = httpx.get(f"{running.state.ingress_url}/ds/sites", headers=headers, timeout=20).json()
    assert len(sites) == 1
    unknown = "0123456789abcdef"
    assert unknown not in sites
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayDsStorage",
            "metadata": {"name": "messages", "namespace": NAMESPACE},
            "spec": {"database": "messages", "sites": [unknown]},
        }
    )
    op = operator()

    def reconciled() -> dict[str, Any]:
        found = api.get("relaydsstorages", NAMESPACE, "messages") or {}
        return condition(found.get("status") or {}, "Reconciled")

    refused = wait_for("the refusal", lambda: reconciled().get("reason") == "Refused", operator=op)
    assert refused
    assert relay.sent("PUT", "/ds/storages/messages/replicas") == [[unknown]]
    message = reconciled()["message"]
    assert message.startswith("Relay answered 400")
    assert unknown in message.lower()  # Relay's own words name the site it does not know

    api.patch(
        f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaydsstorages/messages",
        {"spec": {"sites": sites}},
    )
    wait_for("the accepted set", lambda: reconciled().get("status") == "True", operator=op)
    assert relay.sent("PUT", "/ds/storages/messages/replicas") == [[unknown], sites]
    status = api.get("relaydsstorages", NAMESPACE, "messages")["status"]
    assert status["target"] == sites
    assert status["replicas"] == ",".join(sites)
    assert status["lostReplicas"] == 0
    assert status["shards"]
    replicas = httpx.get(
        f"{running.state.ingress_url}/ds/storages/messages/replicas", headers=headers, timeout=20
    ).json()
    assert replicas == sites

    # A replication factor instead of names: the operator picks the live sites (the same one).
    api.patch(
        f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaydsstorages/messages",
        {"spec": {"sites": None, "replicationFactor": 1}},
    )
    wait_for(
        "the PUT for the replication factor",
        lambda: len(relay.sent("PUT", "/ds/storages/messages/replicas")) == 3,
        operator=op,
    )
    assert relay.sent("PUT", "/ds/storages/messages/replicas")[2] == sites

    # By pods: the site the named retainer hosts (its node is its instance under relayctl).
    api.patch(
        f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaydsstorages/messages",
        {"spec": {"replicationFactor": None, "pods": ["retainer-9"]}},
    )
    wait_for("the unknown pod", lambda: reconciled().get("reason") == "UnknownPods", operator=op)
    assert "retainer-9" in reconciled()["message"]
    assert len(relay.sent("PUT", "/ds/storages/messages/replicas")) == 3  # nothing sent
    api.patch(
        f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaydsstorages/messages",
        {"spec": {"pods": ["retainer-0"]}},
    )
    wait_for(
        "the PUT for the pod",
        lambda: len(relay.sent("PUT", "/ds/storages/messages/replicas")) == 4,
        operator=op,
    )
    assert relay.sent("PUT", "/ds/storages/messages/replicas")[3] == sites
