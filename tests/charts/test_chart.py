"""The Helm chart, rendered and linted for real (Helm SDK), and the skaffold file. Without a
cluster, except where an upgrade's `lookup` matters: there the chart renders against kmock
(`tests.operator.kube`) holding the objects of a previous install."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.helpers import ROOT
from tests.operator import kube

CHART = ROOT / "charts" / "relay"
SERVICES = {"ingress", "queue-writer", "delivery", "retainer", "replicator", "archiver"}
STATEFUL = {"queue-writer", "retainer", "replicator", "archiver"}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    try:
        files = chart.render(values or {}, name="r1", namespace="relay", is_install=True)
    finally:
        chart.close()
    documents = []
    for path, text in files.items():
        if not path.endswith("NOTES.txt"):  # shown to the user, not applied
            documents += [doc for doc in yaml.safe_load_all(text) if doc]
    return documents


def pods(documents: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The services' pod specs (the operator's Deployment aside), by component."""
    for doc in documents:
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        if doc["kind"] in ("Deployment", "StatefulSet") and component != "operator":
            yield (
                doc["metadata"]["labels"]["app.kubernetes.io/component"],
                doc["spec"]["template"]["spec"],
            )


EVERYTHING_ON = {
    "serviceMonitor": {"enabled": True},
    "kafka": {
        "bootstrapServers": "k:9093",
        "securityProtocol": "SASL_SSL",
        "saslMechanism": "SCRAM-SHA-512",
        "saslSecret": "kafka-user",
        "tls": {"caSecret": "kafka-ca", "clientSecret": "kafka-client"},
    },
    "redis": {"url": "rediss://r:6380/0", "passwordSecret": "redis", "caSecret": "rca"},
}
"""Every optional template and branch switched on (for lint and validation)."""


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON, {"operator": {"enabled": False}}])
def test_lint_is_clean(values: dict[str, Any]) -> None:
    result = helm_python.lint(CHART, values, strict=True)
    assert not result["errors"], result
    assert not [m for m in result.get("messages", []) if m.get("severity", 0) >= 2], result


def test_every_service_renders_with_secure_bounded_pods() -> None:
    documents = render()
    rendered = dict(pods(documents))
    assert set(rendered) == SERVICES
    for service, spec in rendered.items():
        assert spec["securityContext"]["runAsNonRoot"] is True
        # The ingress's lame duck (10 s unready, 15 s to close WebSockets) comes first.
        assert spec["terminationGracePeriodSeconds"] == (36 if service == "ingress" else 10)
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


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → the openAPIV3Schema of the chart's own CRDs."""
    schemas = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def validate(documents: list[dict[str, Any]]) -> None:
    """Kubernetes kinds against Kubernetes' schemas; the chart's custom objects against its CRDs
    (schema and CEL rules, as the API server checks them)."""
    schemas = crd_schemas()
    for doc in documents:
        key = (doc["apiVersion"], doc["kind"])
        if key in schemas:
            assert kube.validate(schemas[key], doc) == [], doc
        elif doc["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(doc, "1.30", strict=True)


def test_manifests_validate_against_kubernetes_schemas_and_the_crds() -> None:
    documents = render()
    kinds = {doc["kind"] for doc in documents}
    assert {"RelayCluster", "RelayPool", "KopfPeering", "PodDisruptionBudget"} <= kinds
    validate(documents)
    validate(
        render(
            {
                "serviceMonitor": {"enabled": True},
                "kafka": {
                    "bootstrapServers": "k:9093",
                    "securityProtocol": "SSL",
                    "tls": {"caSecret": "kafka-ca", "clientSecret": "kafka-user"},
                },
                "redis": {"url": "rediss://r:6380/0", "passwordSecret": "redis", "caSecret": "rca"},
                "ingress": {
                    "enabled": True,
                    "replicas": 2,
                    "clientSources": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                },
                "networkPolicy": {"metricsSources": [{"namespaceSelector": {}}]},
                "operator": {"enabled": False},
            }
        )
    )


def test_stateful_services_get_their_replica_count_and_a_volume() -> None:
    documents = render({"queueWriter": {"replicas": 3}})
    statefulset = next(
        d
        for d in documents
        if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "r1-relay-queue-writer"
    )
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
    spec = dict(pods(documents))["ingress"]
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
        {"adminToken": {"existingSecret": ""}},
        {"surprise": True},
        {"queueWriter": {"enabled": True, "replicas": 1, "replica": 2}},
        {"ingress": {"enabled": True, "replicas": 1, "resources": {"limits": {"gpu": 1}}}},
        {"kafka": {"bootstrapServers": "k:9092", "tls": {"ca": "x"}}},
        {"operator": {"enabled": True, "approval": "Sometimes"}},
        {"operator": {"enabled": True, "moveTimeoutSeconds": 1}},
        {"operator": {"enabled": True, "moveKeepSeconds": -1}},
        {"redis": {"url": "redis://user:secret@redis:6379/0"}},
        {"podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
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
    assert artifacts == {f"relay-{s}": s for s in SERVICES | {"operator"}}
    assert all((ROOT / "services" / s / "pyproject.toml").exists() for s in SERVICES)
    assert (ROOT / "operator" / "pyproject.toml").exists()
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
    retainer_env = next(
        c["env"]
        for name, spec in pods(documents)
        if name.endswith("retainer")
        for c in spec["containers"]
    )
    # The retainers read the /ds replica-set targets from the same replicators.
    told = [e["value"] for e in retainer_env if e["name"] == "RELAY_RETAINED__REPLICATORS"]
    assert [json.loads(v) for v in told] == [peers]
    without = render({"replicator": {"enabled": False}})
    assert not any(
        e["name"] == "RELAY_RETAINED__REPLICATORS"
        for _, spec in pods(without)
        for c in spec["containers"]
        for e in c.get("env", [])
    )


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


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["containers"][0]["env"]}


def test_the_admin_token_comes_from_the_existing_secret_and_only_where_it_is_used() -> None:
    documents = render({"adminToken": {"existingSecret": "my-admin", "key": "t"}})
    assert not [d for d in documents if d["kind"] == "Secret"]  # nothing invented per render
    for service, spec in pods(documents):
        token = env_of(spec).get("RELAY_ADMIN_TOKEN")
        if service in ("ingress", "replicator", "retainer"):
            assert token == {"secretKeyRef": {"name": "my-admin", "key": "t"}}
        else:
            assert token is None, service
    # Renders are identical: no random value anywhere.
    assert render() == render()


def test_pods_roll_when_the_configuration_changes() -> None:
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        return {
            d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"][
                "checksum/config"
            ]
            for d in render(values)
            if d["kind"] in ("Deployment", "StatefulSet")
            and d["metadata"]["labels"]["app.kubernetes.io/component"] != "operator"
        }

    before = checksums({})
    assert len(before) == len(SERVICES)
    assert checksums({}) == before
    after = checksums({"logLevel": "debug"})
    assert all(after[name] != before[name] for name in before)


def test_each_stateful_service_gets_a_disruption_budget_by_default() -> None:
    budgets = [d for d in render() if d["kind"] == "PodDisruptionBudget"]
    components = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in budgets}
    assert components == STATEFUL
    assert all(d["spec"]["maxUnavailable"] == 1 for d in budgets)
    assert all(
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        == d["metadata"]["labels"]["app.kubernetes.io/component"]
        for d in budgets
    )
    assert not [
        d
        for d in render({"podDisruptionBudget": {"enabled": False}})
        if d["kind"] == "PodDisruptionBudget"
    ]


def test_the_ingress_is_a_lame_duck_before_it_stops() -> None:
    values = {
        "ingress": {"enabled": True, "replicas": 2, "preStopSeconds": 15, "wsCloseSeconds": 5}
    }
    spec = dict(pods(render(values)))["ingress"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["RELAY_LAME_DUCK_UNREADY_S"] == "15"
    assert env["RELAY_LAME_DUCK_S"] == "21"
    # The grace covers the lame duck and the services' own 8 s drain.
    assert spec["terminationGracePeriodSeconds"] == 31
    others = [s for name, s in pods(render()) if name != "ingress"]
    assert all("RELAY_LAME_DUCK_S" not in str(s["containers"][0]["env"]) for s in others)


def test_the_service_monitor_is_opt_in() -> None:
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    (monitor,) = [
        d
        for d in render(
            {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}}}
        )
        if d["kind"] == "ServiceMonitor"
    ]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "r1"


def test_network_policies_keep_internal_ports_inside_the_release() -> None:
    policies = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in render()
        if d["kind"] == "NetworkPolicy"
    }
    assert set(policies) == SERVICES
    release = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/name": "relay", "app.kubernetes.io/instance": "r1"}
        }
    }
    for service in SERVICES - {"ingress"}:
        (rule,) = policies[service]["spec"]["ingress"]
        assert rule["from"] == [release], service
    # The client port is open to clients unless clientSources narrows it.
    (open_rule,) = policies["ingress"]["spec"]["ingress"]
    assert "from" not in open_rule
    narrowed = next(
        d
        for d in render(
            {
                "ingress": {
                    "enabled": True,
                    "replicas": 1,
                    "clientSources": [{"ipBlock": {"cidr": "10.0.0.0/8"}}],
                }
            }
        )
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-ingress")
    )
    assert narrowed["spec"]["ingress"][0]["from"] == [release, {"ipBlock": {"cidr": "10.0.0.0/8"}}]


def test_redis_and_kafka_secrets_and_ca_files_are_mounted() -> None:
    documents = render(
        {
            "kafka": {
                "bootstrapServers": "k:9093",
                "securityProtocol": "SSL",
                "tls": {"caSecret": "kafka-ca", "clientSecret": "kafka-user"},
            },
            "redis": {
                "url": "rediss://redis:6380/0",
                "passwordSecret": "redis-auth",
                "caSecret": "redis-ca",
            },
        }
    )
    rendered = dict(pods(documents))
    for service, spec in rendered.items():
        env = env_of(spec)
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert env["RELAY_KAFKA__SSL_CAFILE"] == "/etc/relay/kafka-ca/ca.crt"
        assert env["RELAY_KAFKA__SSL_CERTFILE"] == "/etc/relay/kafka-client/tls.crt"
        assert mounts["kafka-ca"] == "/etc/relay/kafka-ca"
        assert volumes["kafka-client"]["secret"]["secretName"] == "kafka-user"
        if service in ("ingress", "delivery"):
            assert env["RELAY_REDIS_PASSWORD"] == {
                "secretKeyRef": {"name": "redis-auth", "key": "password"}
            }
            assert env["RELAY_REDIS_URL"] == (
                "rediss://:$(RELAY_REDIS_PASSWORD)@redis:6380/0"
                "?ssl_ca_certs=/etc/relay/redis-ca/ca.crt"
            )
            assert volumes["redis-ca"]["secret"]["secretName"] == "redis-ca"
            # The password variable is defined before the URL that expands it.
            names = [e["name"] for e in spec["containers"][0]["env"]]
            assert names.index("RELAY_REDIS_PASSWORD") < names.index("RELAY_REDIS_URL")
        else:
            assert "RELAY_REDIS_PASSWORD" not in env
            assert "redis-ca" not in volumes


def test_the_operator_takes_over_dumps_and_gets_its_rbac_and_objects() -> None:
    documents = render({"queueWriter": {"enabled": True, "replicas": 2}})
    config = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    assert config["RELAY_DUMP_INTERVAL_S"] == "0"
    deployment = next(
        d
        for d in documents
        if d["metadata"]["name"] == "r1-relay-operator" and d["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "relay-operator:0.1.0"
    assert container["args"][:3] == ["run", "-m", "relay_operator.handlers"]
    assert "--peering" in container["args"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "r1-relay-operator"
    role = next(d for d in documents if d["kind"] == "Role")
    secrets = next(r for r in role["rules"] if r["resources"] == ["secrets"])
    assert secrets == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["relay-admin"],
        "verbs": ["get"],
    }
    # Partition moves call each pool instance at its Pod's IP: pods are read, never written.
    pods = next(r for r in role["rules"] if r["resources"] == ["pods"])
    assert pods == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    cluster = next(d for d in documents if d["kind"] == "RelayCluster")
    assert (
        cluster["spec"]["moveBudgetSeconds"],
        cluster["spec"]["moveTimeoutSeconds"],
        cluster["spec"]["moveKeepSeconds"],
        cluster["spec"]["approval"],
    ) == (2, 300, 60, "Manual")
    assert cluster["spec"]["adminUrl"] == "http://r1-relay-ingress.relay.svc:8080"
    assert (cluster["spec"]["adminSecret"], cluster["spec"]["adminSecretKey"]) == (
        "relay-admin",
        "token",
    )
    assert cluster["spec"]["partitions"] == 8
    pools = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "RelayPool"}
    assert pools == {
        "queue-writer": {
            "service": "queue-writer",
            "statefulSet": "r1-relay-queue-writer",
            "replicas": 2,
        },
        "retainer": {"service": "retainer", "statefulSet": "r1-relay-retainer", "replicas": 1},
    }
    without = render({"operator": {"enabled": False}})
    assert (
        "RELAY_DUMP_INTERVAL_S" not in next(d for d in without if d["kind"] == "ConfigMap")["data"]
    )
    assert not [d for d in without if d["kind"] in ("RelayCluster", "RelayPool", "Role")]


def test_every_crd_ships_with_the_chart() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        crds = chart.crds
    finally:
        chart.close()
    assert len(crds) == 5


@pytest.fixture
def previous_install() -> Iterator[kube.Served]:
    """An API server holding what an earlier install left: one queue-writer, 8 partitions."""
    with kube.serve() as api:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "relay"}})
        api.create(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "r1-relay-queue-writer", "namespace": "relay"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}},
            }
        )
        api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "r1-relay", "namespace": "relay"},
                "data": {"RELAY_KAFKA__PARTITIONS": "8"},
            }
        )
        yield api


def upgrade(api: kube.Served, tmp_path: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    """`helm upgrade --dry-run=server`: rendered with `lookup` answered by the API server."""
    config = helm_python.Config(
        kubeconfig_path=str(kube.kubeconfig(tmp_path / "kubeconfig", api.url, "relay")),
        namespace="relay",
    )
    chart = helm_python.Chart.load(CHART)
    try:
        files = config.render(chart, values, name="r1", namespace="relay", is_upgrade=True)
    finally:
        chart.close()
    return [
        doc
        for path, text in files.items()
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def test_without_the_operator_a_partition_owner_count_change_is_refused(
    previous_install: kube.Served, tmp_path: Any
) -> None:
    with pytest.raises(helm_python.HelmError, match="moves partition ownership"):
        upgrade(
            previous_install,
            tmp_path,
            {"operator": {"enabled": False}, "queueWriter": {"enabled": True, "replicas": 2}},
        )
    same = upgrade(previous_install, tmp_path, {"operator": {"enabled": False}})
    statefulset = next(
        d for d in same if d["kind"] == "StatefulSet" and "queue-writer" in d["metadata"]["name"]
    )
    assert statefulset["spec"]["replicas"] == 1


def test_with_the_operator_the_statefulset_keeps_its_count_and_the_pool_asks(
    previous_install: kube.Served, tmp_path: Any
) -> None:
    documents = upgrade(
        previous_install, tmp_path, {"queueWriter": {"enabled": True, "replicas": 3}}
    )
    statefulset = next(
        d
        for d in documents
        if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "r1-relay-queue-writer"
    )
    assert statefulset["spec"]["replicas"] == 1
    env = env_of(statefulset["spec"]["template"]["spec"])
    assert env["RELAY_DATA__REPLICAS"] == "1"
    pool = next(
        d for d in documents if d["kind"] == "RelayPool" and d["metadata"]["name"] == "queue-writer"
    )
    assert pool["spec"]["replicas"] == 3


def test_a_partition_count_change_is_refused_on_upgrade(
    previous_install: kube.Served, tmp_path: Any
) -> None:
    with pytest.raises(helm_python.HelmError, match="partitions are fixed"):
        upgrade(
            previous_install, tmp_path, {"kafka": {"bootstrapServers": "k:9092", "partitions": 16}}
        )
    assert upgrade(
        previous_install, tmp_path, {"kafka": {"bootstrapServers": "k:9092", "partitions": 8}}
    )


def test_the_notes_say_how_to_scale_and_where_the_token_is() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        files = chart.render({}, name="r1", namespace="relay", is_install=True)
    finally:
        chart.close()
    notes = next(text for path, text in files.items() if path.endswith("NOTES.txt"))
    assert "kubectl -n relay scale relaypool queue-writer" in notes
    assert "Secret relay-admin" in notes
