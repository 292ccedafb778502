"""`kopf run` of the operator against the test API server: pools adopt their StatefulSet, a
retainer pool's scale is planned and blocked (its hand-off is not built; the queue-writer's runs,
tests/operator/test_scale.py), a direct StatefulSet edit is put back, and the operator's
Kubernetes calls survive injected 409 and 500 answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.operator import kube
from tests.operator.conftest import NAMESPACE, Operator, wait_for

STS = "r1-relay-queue-writer"
STS_PATH = f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{STS}"
POOL_PATH = f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypools/queue-writer"
RETAINER_PATH = f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypools/retainer"


def install(api: kube.Served, replicas: int = 2, service: str = "queue-writer") -> None:
    """What the chart installs for one pool (the Kubernetes side only: no Relay runs)."""
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayCluster",
            "metadata": {"name": "relay", "namespace": NAMESPACE},
            "spec": {
                "partitions": 8,
                "adminSecret": "r1-relay-admin",
                "adminUrl": "http://127.0.0.1:9",
                "dumpIntervalSeconds": 0,
            },
        }
    )
    api.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": f"r1-relay-{service}",
                "namespace": NAMESPACE,
                "labels": {"app.kubernetes.io/name": "relay"},
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/component": service}},
            },
            "status": {"readyReplicas": replicas},
        }
    )
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayPool",
            "metadata": {"name": service, "namespace": NAMESPACE},
            "spec": {
                "service": service,
                "statefulSet": f"r1-relay-{service}",
                "replicas": replicas,
            },
        }
    )


def pool_status(api: kube.Served, pool: str = "queue-writer") -> dict[str, Any]:
    found = api.get("relaypools", NAMESPACE, pool) or {}
    return dict(found.get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def test_a_retainer_scale_is_planned_and_blocked_and_the_statefulset_stays(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    install(api, service="retainer")
    op = operator()
    adopted = wait_for(
        "the pool's adoption", lambda: pool_status(api, "retainer").get("replicas"), operator=op
    )
    assert adopted == 2
    status = pool_status(api, "retainer")
    assert status["assignment"] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert status["selector"] == "app.kubernetes.io/component=retainer"
    assert condition(status, "ScaleBlocked")["status"] == "False"

    api.patch(RETAINER_PATH, {"spec": {"replicas": 3}})
    blocked = wait_for(
        "ScaleBlocked",
        lambda: condition(pool_status(api, "retainer"), "ScaleBlocked").get("status") == "True",
        operator=op,
    )
    assert blocked
    message = condition(pool_status(api, "retainer"), "ScaleBlocked")["message"]
    assert "the retainer's partition hand-off is not implemented" in message
    moves = wait_for("the planned moves", lambda: api.items("relaypartitionmoves"), operator=op)
    # 8 partitions over 3: the two new-ordinal partitions come from the fullest owners.
    specs = sorted((m["spec"]["partition"], m["spec"]["fromOrdinal"]) for m in moves)
    assert specs == [(6, 0), (7, 1)]
    assert all(m["spec"]["toOrdinal"] == 2 and m["spec"]["generation"] == 2 for m in moves)
    wait_for(
        "the moves' Planned phase",
        lambda: all(
            (m.get("status") or {}).get("phase") == "Planned"
            for m in api.items("relaypartitionmoves")
        ),
        operator=op,
    )
    # Nothing ran: the StatefulSet and the owners in force are as before.
    assert api.get("statefulsets", NAMESPACE, "r1-relay-retainer")["spec"]["replicas"] == 2
    assert pool_status(api, "retainer")["replicas"] == 2
    assert api.sent("PATCH", "statefulsets") == []
    cluster = wait_for(
        "ScaleBlocked on the RelayCluster",
        lambda: (
            condition(
                (api.get("relayclusters", NAMESPACE, "relay") or {}).get("status") or {},
                "ScaleBlocked",
            ).get("status")
            == "True"
        ),
        operator=op,
    )
    assert cluster

    def cluster_condition(type_: str) -> dict[str, Any]:
        return condition(api.get("relayclusters", NAMESPACE, "relay")["status"], type_)

    # 2 of 2 owners ready (the timer summarizes the pools' index, one tick behind at most).
    wait_for("Ready", lambda: cluster_condition("Ready").get("status") == "True", operator=op)
    assert cluster_condition("Migrating")["status"] == "False"

    # Asking for 4 instead replaces the plan: the moves for 3 that no longer fit are dropped.
    api.patch(RETAINER_PATH, {"spec": {"replicas": 4}})
    wait_for(
        "the plan for 4",
        lambda: (
            sorted(
                (m["spec"]["partition"], m["spec"]["toOrdinal"])
                for m in api.items("relaypartitionmoves")
            )
            == [(4, 2), (5, 2), (6, 3), (7, 3)]
        ),
        operator=op,
    )
    api.patch(RETAINER_PATH, {"spec": {"replicas": 2}})
    wait_for(
        "ScaleBlocked cleared",
        lambda: condition(pool_status(api, "retainer"), "ScaleBlocked").get("status") == "False",
        operator=op,
    )
    wait_for("the plan withdrawn", lambda: api.items("relaypartitionmoves") == [], operator=op)


def test_a_direct_statefulset_edit_is_put_back(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    install(api)
    op = operator()
    wait_for("the pool's adoption", lambda: pool_status(api).get("replicas"), operator=op)
    api.patch(STS_PATH, {"spec": {"replicas": 3}})  # kubectl scale statefulset ... --replicas=3
    wait_for(
        "the StatefulSet put back to 2",
        lambda: api.get("statefulsets", NAMESPACE, STS)["spec"]["replicas"] == 2,
        operator=op,
    )
    patches = api.sent("PATCH", "statefulsets")
    assert patches[0] == {"spec": {"replicas": 3}}
    assert {"spec": {"replicas": 2}} in patches[1:]
    assert "set to 3 replicas directly" in op.text()


def test_conflicts_and_server_errors_on_patch_are_retried_with_backoff(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    install(api)
    op = operator()
    wait_for("the pool's adoption", lambda: pool_status(api).get("replicas"), operator=op)
    restore = {"spec": {"replicas": 2}}
    fault = api.call(
        lambda server: server.inject(
            "PATCH", "statefulsets", [409, 500], when=lambda body: body == restore
        )
    )
    api.patch(STS_PATH, {"spec": {"replicas": 4}})
    wait_for(
        "the StatefulSet put back to 2 through the injected faults",
        lambda: api.get("statefulsets", NAMESPACE, STS)["spec"]["replicas"] == 2,
        operator=op,
    )
    assert fault.hits == [409, 500]
    restores = [body for body in api.sent("PATCH", "statefulsets") if body == restore]
    assert len(restores) >= 3  # two refused, then the one that landed
    assert "answered 409; trying again" in op.text()
    assert "answered 500; trying again" in op.text()


def test_kopfs_own_status_patches_survive_server_errors(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    # The adoption is written by kopf's status patch: two 5xx answers first, then it lands.
    install(api)
    fault = api.call(
        lambda server: server.inject("PATCH", "relaypools", [500, 503], subresource="status")
    )
    op = operator()
    adopted = wait_for("the pool's adoption", lambda: pool_status(api).get("replicas"), operator=op)
    assert adopted == 2
    assert fault.hits == [500, 503]


def test_a_pool_created_before_its_statefulset_adopts_it_once_it_exists(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayCluster",
            "metadata": {"name": "relay", "namespace": NAMESPACE},
            "spec": {
                "partitions": 4,
                "adminSecret": "missing",
                "adminUrl": "http://127.0.0.1:9",
                "dumpIntervalSeconds": 3600,
            },
        }
    )
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayPool",
            "metadata": {"name": "retainer", "namespace": NAMESPACE},
            "spec": {"service": "retainer", "statefulSet": "r1-relay-retainer", "replicas": 1},
        }
    )
    op = operator()
    # The dump cannot run without the admin Secret: said in DumpsHealthy, not crashed on.
    healthy = wait_for(
        "DumpsHealthy=False",
        lambda: condition(
            (api.get("relayclusters", NAMESPACE, "relay") or {}).get("status") or {},
            "DumpsHealthy",
        ),
        operator=op,
    )
    assert (healthy["status"], healthy["reason"]) == ("False", "DumpFailed")
    assert "admin Secret missing unreadable" in healthy["message"]
    wait_for("a failed adoption", lambda: "StatefulSet r1-relay-retainer" in op.text(), operator=op)
    api.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "r1-relay-retainer", "namespace": NAMESPACE},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"c": "retainer"}}},
        }
    )
    found = wait_for(
        "the adoption",
        lambda: (
            (api.get("relaypools", NAMESPACE, "retainer") or {}).get("status", {}).get("assignment")
        ),
        operator=op,
    )
    assert found == [0, 0, 0, 0]
