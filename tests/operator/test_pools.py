"""`kopf run` of the operator against the test API server: pools adopt their StatefulSet, a
retainer pool's scale is planned and started as a queue-writer pool's is (the moves against
real processes: tests/operator/test_scale.py and test_scale_retainer.py), a direct StatefulSet
edit is put back, and the operator's Kubernetes calls survive injected 409 and 500 answers."""

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


def test_a_retainer_pools_scale_is_planned_and_run_as_a_queue_writer_pools_is(
    api: kube.Served, operator: Callable[..., Operator]
) -> None:
    """The scale's Kubernetes side (no Relay runs here: the moves themselves, against real
    retainers, are tests/operator/test_scale_retainer.py's): adoption, the plan, the
    StatefulSet raised before any move, the moves waiting for the new pod."""
    install(api, service="retainer")
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "r1-relay-admin", "namespace": NAMESPACE},
            "data": {"token": "dG9rZW4="},
        }
    )
    op = operator()
    adopted = wait_for(
        "the pool's adoption", lambda: pool_status(api, "retainer").get("replicas"), operator=op
    )
    assert adopted == 2
    status = pool_status(api, "retainer")
    assert status["assignment"] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert status["selector"] == "app.kubernetes.io/component=retainer"

    api.patch(RETAINER_PATH, {"spec": {"replicas": 3}})

    def planned() -> list[dict[str, Any]] | None:
        """Both moves: the operator creates them one after the other."""
        found = api.items("relaypartitionmoves")
        return found if len(found) >= 2 else None

    moves = wait_for("the planned moves", planned, operator=op)
    # 8 partitions over 3: the two new-ordinal partitions come from the fullest owners.
    specs = sorted((m["spec"]["partition"], m["spec"]["fromOrdinal"]) for m in moves)
    assert specs == [(6, 0), (7, 1)]
    assert all(m["spec"]["toOrdinal"] == 2 and m["spec"]["pool"] == "retainer" for m in moves)
    raised = wait_for(
        "the StatefulSet raised first",
        lambda: api.get("statefulsets", NAMESPACE, "r1-relay-retainer")["spec"]["replicas"] == 3,
        operator=op,
    )
    assert raised
    migrating = wait_for(
        "Migrating while pod 2 is awaited",
        lambda: condition(pool_status(api, "retainer"), "Migrating").get("status") == "True",
        operator=op,
    )
    assert migrating
    # No pod 2 ever answers here: nothing moved, the owners in force are as before.
    assert all(
        (m.get("status") or {}).get("phase", "Planned") == "Planned"
        for m in api.items("relaypartitionmoves")
    )
    assert pool_status(api, "retainer")["assignment"] == [0, 1, 0, 1, 0, 1, 0, 1]


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
