"""The chart's CRDs: their shape, and the refusals their schemas and CEL rules make, checked as
the API server checks them (the adapter in `kube` validates with jsonschema and evaluates the
`x-kubernetes-validations` rules with a CEL interpreter)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.operator import kube
from tests.operator.conftest import CRDS, NAMESPACE

RELAY_CRDS = {
    "relayclusters.relay.dev",
    "relaypools.relay.dev",
    "relaypartitionmoves.relay.dev",
    "relaydsstorages.relay.dev",
}
SITE = "0123456789abcdef"


def crds() -> dict[str, dict[str, Any]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))]
    return {d["metadata"]["name"]: d for d in docs}


@pytest.fixture(scope="module")
def served() -> Iterator[kube.Served]:
    with kube.serve(CRDS) as api:
        yield api


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "relay.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def path(plural: str, name: str) -> str:
    return f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/{plural}/{name}"


def test_every_crd_is_relay_dev_v1alpha1_with_status_and_printer_columns() -> None:
    found = crds()
    assert set(found) >= RELAY_CRDS
    for name in RELAY_CRDS:
        spec = found[name]["spec"]
        assert spec["group"] == "relay.dev"
        (version,) = spec["versions"]
        assert version["name"] == "v1alpha1"
        assert "status" in version["subresources"]
        assert len(version["additionalPrinterColumns"]) >= 3
        rules = yaml.safe_dump(version["schema"])
        assert "x-kubernetes-validations" in rules
    (pool,) = found["relaypools.relay.dev"]["spec"]["versions"]
    assert pool["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    (move,) = found["relaypartitionmoves.relay.dev"]["spec"]["versions"]
    phases = move["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]
    assert phases["enum"] == [
        "Planned",
        "Prefetching",
        "Paused",
        "CatchingUp",
        "Committed",
        "Released",
        "RolledBack",
        "Failed",
    ]


def test_a_cluster_gets_its_defaults_and_its_partitions_never_change(served: kube.Served) -> None:
    created = served.create(
        obj(
            "RelayCluster", "c1", {"partitions": 8, "adminSecret": "s", "adminUrl": "http://i:8080"}
        )
    )
    assert created["spec"]["dumpIntervalSeconds"] == 3600
    assert created["spec"]["approval"] == "Manual"
    with pytest.raises(kube.ApiError, match="partitions is immutable") as refused:
        served.patch(path("relayclusters", "c1"), {"spec": {"partitions": 16}})
    assert refused.value.status == 422
    assert served.get("relayclusters", NAMESPACE, "c1")["spec"]["partitions"] == 8
    served.patch(path("relayclusters", "c1"), {"spec": {"dumpIntervalSeconds": 600}})


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("RelayCluster", {"partitions": 8, "adminSecret": "s"}, "adminUrl"),
        ("RelayCluster", {"partitions": 0, "adminSecret": "s", "adminUrl": "http://i"}, "minimum"),
        (
            "RelayCluster",
            {"partitions": 8, "adminSecret": "s", "adminUrl": "ftp://i"},
            "does not match",
        ),
        (
            "RelayCluster",
            {
                "partitions": 8,
                "adminSecret": "s",
                "adminUrl": "http://i",
                "dumpIntervalSeconds": 60,
                "dumpTimeoutSeconds": 60,
            },
            "must exceed dumpTimeoutSeconds",
        ),
        (
            "RelayCluster",
            {"partitions": 8, "adminSecret": "s", "adminUrl": "http://i", "approval": "Maybe"},
            "is not one of",
        ),
        ("RelayPool", {"service": "queue-writer", "statefulSet": "s", "replicas": 0}, "minimum"),
        ("RelayPool", {"service": "delivery", "statefulSet": "s", "replicas": 1}, "is not one of"),
        (
            "RelayPartitionMove",
            {"pool": "p", "partition": 1, "fromOrdinal": 1, "toOrdinal": 1, "generation": 2},
            "must differ",
        ),
        ("RelayDsStorage", {"database": "messages"}, "exactly one of sites, pods and replication"),
        (
            "RelayDsStorage",
            {"database": "messages", "pods": ["relay-retainer-0"], "replicationFactor": 1},
            "exactly one",
        ),
        ("RelayDsStorage", {"database": "messages", "pods": ["r-0", "r-0"]}, "named once"),
        ("RelayDsStorage", {"database": "messages", "pods": ["Not_A_Pod"]}, "does not match"),
        (
            "RelayDsStorage",
            {"database": "messages", "sites": [SITE], "replicationFactor": 1},
            "exactly one",
        ),
        ("RelayDsStorage", {"database": "messages", "sites": [SITE, SITE]}, "named once"),
        ("RelayDsStorage", {"database": "messages", "sites": ["nothex"]}, "does not match"),
        ("RelayDsStorage", {"database": "a/b", "replicationFactor": 1}, "does not match"),
    ],
)
def test_bad_objects_are_refused(
    served: kube.Served, kind: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(kube.ApiError, match=message) as refused:
        served.create(obj(kind, "bad", spec))
    assert refused.value.status == 422
    assert served.get(f"{kind.lower()}s", NAMESPACE, "bad") is None


def test_immutable_fields_of_pools_moves_and_storages(served: kube.Served) -> None:
    served.create(
        obj("RelayPool", "p1", {"service": "retainer", "statefulSet": "s", "replicas": 1})
    )
    served.patch(path("relaypools", "p1"), {"spec": {"replicas": 3}})
    with pytest.raises(kube.ApiError, match="service is immutable"):
        served.patch(path("relaypools", "p1"), {"spec": {"service": "queue-writer"}})
    move = {"pool": "p1", "partition": 1, "fromOrdinal": 0, "toOrdinal": 1, "generation": 2}
    served.create(obj("RelayPartitionMove", "m1", move))
    with pytest.raises(kube.ApiError, match="spec is immutable"):
        served.patch(path("relaypartitionmoves", "m1"), {"spec": {"toOrdinal": 2}})
    with pytest.raises(kube.ApiError, match="is not one of"):
        served.patch(path("relaypartitionmoves", "m1") + "/status", {"status": {"phase": "Done"}})
    served.patch(path("relaypartitionmoves", "m1") + "/status", {"status": {"phase": "Planned"}})
    served.create(obj("RelayDsStorage", "d1", {"database": "messages", "replicationFactor": 2}))
    with pytest.raises(kube.ApiError, match="database is immutable"):
        served.patch(path("relaydsstorages", "d1"), {"spec": {"database": "other"}})
