"""The Helm chart, rendered and linted for real (Helm SDK, no cluster), and the skaffold file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.helpers import ROOT

CHART = ROOT / "charts" / "relay"
SERVICES = {"ingress", "queue-writer", "delivery", "retainer", "replicator", "archiver"}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    try:
        files = chart.render(values or {}, name="r1", namespace="relay", is_install=True)
    finally:
        chart.close()
    documents = []
    for text in files.values():
        documents += [doc for doc in yaml.safe_load_all(text) if doc]
    return documents


def pods(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in documents:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            yield (
                doc["metadata"]["labels"]["app.kubernetes.io/component"],
                doc["spec"]["template"]["spec"],
            )


def test_lint_is_clean() -> None:
    result = helm_python.lint(CHART, {}, strict=True)
    assert not [m for m in result.get("messages", []) if m.get("severity", 0) >= 2], result


def test_every_service_renders_with_secure_bounded_pods() -> None:
    documents = render()
    rendered = dict(pods(documents))
    assert set(rendered) == SERVICES
    for service, spec in rendered.items():
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["terminationGracePeriodSeconds"] == 10
        (container,) = spec["containers"]
        assert container["image"] == f"relay-{service}:0.1.0"
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["resources"]["limits"]["memory"]
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in documents}
    assert ("StatefulSet", "r1-relay-queue-writer") in kinds
    assert ("StatefulSet", "r1-relay-retainer") in kinds
    assert ("Deployment", "r1-relay-ingress") in kinds
    assert ("StatefulSet", "r1-relay-archiver") in kinds
    assert ("Service", "r1-relay-ingress") in kinds


def test_manifests_validate_against_kubernetes_schemas() -> None:
    for doc in render():
        kubernetes_validate.validate(doc, "1.30", strict=True)


def test_stateful_services_get_their_replica_count_and_a_volume() -> None:
    documents = render({"queueWriter": {"replicas": 3}})
    statefulset = next(d for d in documents if d["metadata"]["name"] == "r1-relay-queue-writer")
    assert statefulset["spec"]["replicas"] == 3
    env = {
        e["name"]: e.get("value")
        for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["RELAY_DATA__REPLICAS"] == "3"
    assert env["RELAY_DATA__DIR"] == "/data"
    assert (
        statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
        == "10Gi"
    )


def test_services_can_be_switched_off() -> None:
    assert set(dict(pods(render({"retainer": {"enabled": False}})))) == SERVICES - {"retainer"}


def test_configuration_reaches_the_pods() -> None:
    documents = render(
        {
            "kafka": {
                "bootstrapServers": "k1:9093,k2:9093",
                "securityProtocol": "SASL_SSL",
                "saslMechanism": "SCRAM-SHA-512",
                "saslSecret": "kafka-user",
            }
        }
    )
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    assert config["RELAY_KAFKA__BOOTSTRAP_SERVERS"] == "k1:9093,k2:9093"
    # A production cluster's defaults: an acknowledged write is on two of three brokers.
    assert config["RELAY_KAFKA__REPLICATION_FACTOR"] == "3"
    assert config["RELAY_KAFKA__MIN_INSYNC_REPLICAS"] == "2"
    assert config["RELAY_KAFKA__SASL_MECHANISM"] == "SCRAM-SHA-512"
    _, spec = next(pods(documents))
    names = {e["name"] for e in spec["containers"][0]["env"]}
    assert {
        "RELAY_KAFKA__SASL_USERNAME",
        "RELAY_KAFKA__SASL_PASSWORD",
        "RELAY_ADMIN_TOKEN",
    } <= names


@pytest.mark.parametrize(
    "values",
    [
        {"kafka": {"bootstrapServers": "no-port"}},
        {"ingress": {"replicas": 0}},
        {"redis": {"url": "http://redis"}},
        {"logLevel": "loud"},
    ],
)
def test_invalid_values_are_refused(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        render(values)


def test_min_insync_replicas_above_the_replication_factor_is_refused() -> None:
    with pytest.raises(helm_python.HelmError, match="minInsyncReplicas cannot exceed"):
        render({"kafka": {"replicationFactor": 1, "minInsyncReplicas": 2}})


def test_sasl_without_its_secret_is_refused() -> None:
    with pytest.raises(helm_python.HelmError, match="saslSecret is required"):
        render({"kafka": {"securityProtocol": "SASL_SSL", "saslMechanism": "PLAIN"}})


def test_skaffold_builds_one_image_per_service_and_deploys_the_chart() -> None:
    config = yaml.safe_load((ROOT / "skaffold.yaml").read_text())
    artifacts = {
        a["image"]: a["docker"]["buildArgs"]["SERVICE"] for a in config["build"]["artifacts"]
    }
    assert artifacts == {f"relay-{s}": s for s in SERVICES}
    assert all((ROOT / "services" / s / "pyproject.toml").exists() for s in artifacts.values())
    (release,) = config["deploy"]["helm"]["releases"]
    assert (ROOT / release["chartPath"] / "Chart.yaml").exists()
    assert (ROOT / "Dockerfile").exists()


def test_every_replicator_is_told_every_peer() -> None:
    documents = render({"replicator": {"replicas": 3}})
    env = next(
        c["env"]
        for name, spec in pods(documents)
        if name.endswith("replicator")
        for c in spec["containers"]
    )
    peers = next(json.loads(e["value"]) for e in env if e["name"] == "RELAY_KV__PEERS")
    assert len(peers) == 3
    assert all(p.startswith("http://") and p.endswith(":8080") for p in peers)
    assert peers[2].split("//")[1].split(".")[0].endswith("replicator-2")


def test_archiver_settings_reach_the_config() -> None:
    documents = render(
        {
            "archiver": {
                "enabled": True,
                "replicas": 1,
                "location": "s3://b/relay",
                "rollAgeSeconds": 30,
            }
        }
    )
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    assert config["RELAY_ARCHIVE__LOCATION"] == "s3://b/relay"
    assert config["RELAY_ARCHIVE__ROLL_AGE_S"] == "30"
    assert config["RELAY_ARCHIVE__ROLL_BYTES"] == "67108864"
    with pytest.raises(helm_python.HelmError):
        render({"archiver": {"enabled": True, "replicas": 1, "rollBytes": 0}})
