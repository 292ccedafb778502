"""`kopf run` of the operator scaling a queue-writer pool 1 -> 2 -> 1 by partition moves, against
real queue-writer processes (tests/operator/statefulsets.py stands in for the StatefulSet
controller) on the real Apache Kafka broker, while SENDs are put on the moved partitions as the
ingress puts them (tests/runtime/test_queue_writer_handoff.py's `Load`).

Checked: every acknowledged message is held, in the order sent, by the instance that owns its
partition at the end; no two instances ever serve one partition (both asked at `GET
/internal/ownership` every 50 ms throughout); each move is Released with its pause within the
budget (the pause per move is printed); the StatefulSet is raised before the moves of a scale
up and lowered only after those of a scale down; a pod SIGKILLed at any step of a move loses
nothing and the move rolls back or goes on as its phase allows."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from relay_operator import pools, times
from tests import helpers
from tests.operator import kube
from tests.operator.conftest import NAMESPACE, Operator, wait_for
from tests.operator.statefulsets import StatefulSetStandIn
from tests.runtime.handoff_calls import AUTH, PARTITIONS, TOKEN
from tests.runtime.test_queue_writer_handoff import Load, bodies

STS = "r1-relay-queue-writer"
POOL_PATH = f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypools/queue-writer"
BUDGET_S = 2
SCALE_S = 180.0


class Owners:
    """Asks every running instance which partitions it serves, every 50 ms, in a thread;
    keeps each answer set and any moment two instances served one partition."""

    def __init__(self, pods: StatefulSetStandIn) -> None:
        self.pods = pods
        self.overlaps: list[dict[int, list[int]]] = []
        self.seen: list[dict[int, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Owners:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(headers=AUTH, timeout=2) as client:
            while not self._stop.is_set():
                serving: dict[int, list[int]] = {}
                for ordinal, url in self.pods.urls().items():
                    try:
                        answer = client.get(f"{url}/internal/ownership")
                    except httpx.HTTPError:
                        continue
                    if answer.status_code == 200:
                        serving[ordinal] = answer.json()["serving"]
                flat = [p for share in serving.values() for p in share]
                if len(flat) != len(set(flat)):
                    self.overlaps.append(serving)
                if not self.seen or self.seen[-1] != serving:
                    self.seen.append(serving)
                time.sleep(0.05)


@contextmanager
def stood_in(
    api: kube.Served, kafka: helpers.Kafka, root: Path, service: str, sts: str, **env: str
) -> Iterator[StatefulSetStandIn]:
    """A StatefulSet `sts` of one `relay-<service>` on the test API server, and the stand-in
    running its pods (`env`: added to each pod's settings)."""

    def pod_env(ordinal: int) -> dict[str, str]:
        return {
            **kafka.env(),
            "RELAY_KAFKA__PARTITIONS": str(PARTITIONS),
            "RELAY_ADMIN_TOKEN": TOKEN,
            "RELAY_DATA__REPLICAS": "1",
            **env,
        }

    api.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": sts,
                "namespace": NAMESPACE,
                "labels": {"app.kubernetes.io/name": "relay"},
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/component": service}},
            },
        }
    )
    with StatefulSetStandIn(api, NAMESPACE, sts, root, pod_env, f"relay-{service}") as standin:
        yield standin
    assert standin.error is None, repr(standin.error)


@pytest.fixture
def pods(api: kube.Served, kafka: helpers.Kafka, tmp_path: Path) -> Iterator[StatefulSetStandIn]:
    with stood_in(
        api, kafka, tmp_path / "pods", "queue-writer", STS, RELAY_DUMP_INTERVAL_S="0"
    ) as standin:
        yield standin


def install(
    api: kube.Served, port: int, service: str = "queue-writer", sts: str = STS, **cluster: Any
) -> None:
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "r1-relay-admin", "namespace": NAMESPACE},
            "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
        }
    )
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayCluster",
            "metadata": {"name": "relay", "namespace": NAMESPACE},
            "spec": {
                "partitions": PARTITIONS,
                "adminSecret": "r1-relay-admin",
                "adminUrl": "http://127.0.0.1:9",
                "dumpIntervalSeconds": 0,
                "moveBudgetSeconds": BUDGET_S,
                "moveKeepSeconds": 0,
                "approval": "Auto",
                **cluster,
            },
        }
    )
    api.create(
        {
            "apiVersion": "relay.dev/v1alpha1",
            "kind": "RelayPool",
            "metadata": {"name": service, "namespace": NAMESPACE},
            "spec": {"service": service, "statefulSet": sts, "replicas": 1, "port": port},
        }
    )


def pool_status(api: kube.Served, pool: str = "queue-writer") -> dict[str, Any]:
    return dict((api.get("relaypools", NAMESPACE, pool) or {}).get("status") or {})


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def at_size(api: kube.Served, replicas: int, pool: str = "queue-writer") -> bool:
    status = pool_status(api, pool)
    blocked = condition(status, "ScaleBlocked")
    return status.get("replicas") == replicas and blocked.get("reason") == "AtSize"


def moves_of(api: kube.Served) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in api.items("relaypartitionmoves")}


def same_bodies(held: dict[str, list[str]], acknowledged: dict[str, list[str]]) -> str:
    """ "" when each queue holds exactly its acknowledged bodies in order; else what differs."""
    problems = []
    for queue in sorted(set(held) | set(acknowledged)):
        have, want = held.get(queue, []), acknowledged.get(queue, [])
        if have != want:
            missing = [b for b in want if b not in have]
            extra = [b for b in have if b not in want]
            problems.append(
                f"{queue}: {len(have)} held, {len(want)} acknowledged, missing {missing[:10]}, "
                f"extra {extra[:10]}, duplicates {len(have) - len(set(have))}"
            )
    return "; ".join(problems)


def released(found: dict[str, dict[str, Any]]) -> list[str]:
    """Check that every move is Released with equal digests and its pause within the budget;
    a line on each, in generation order."""
    lines = []
    for name, move in sorted(found.items(), key=lambda kv: kv[1]["spec"]["generation"]):
        spec, result = move["spec"], move["status"]
        assert result["phase"] == "Released", (name, result)
        assert result["sourceDigest"] == result["targetDigest"]
        assert 0 < result["pauseMs"] <= BUDGET_S * 1000
        took = (times.parse(result["finishedAt"]) or 0) - (times.parse(result["startedAt"]) or 0)
        lines.append(
            f"{name}: p{spec['partition']} {spec['fromOrdinal']}->{spec['toOrdinal']} "
            f"pause {result['pauseMs']:.0f} ms, move {took * 1000:.0f} ms"
        )
    return lines


def wait_at_size(api: kube.Served, replicas: int, op: Operator, pool: str = "queue-writer") -> None:
    """Wait for the pool at `replicas`; on timeout, say where its moves and status were."""
    try:
        wait_for(f"the pool at {replicas}", lambda: at_size(api, replicas, pool), SCALE_S, op)
    except AssertionError as error:
        state = {n: m.get("status") for n, m in moves_of(api).items()}
        raise AssertionError(f"{error}\nmoves: {state}\npool: {pool_status(api, pool)}") from None


def test_a_queue_writer_pool_scales_one_two_one_under_load_losing_nothing(
    api: kube.Served,
    pods: StatefulSetStandIn,
    kafka: helpers.Kafka,
    operator: Callable[..., Operator],
) -> None:
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port)
    op = operator()
    wait_for("the adoption", lambda: pool_status(api).get("assignment"), operator=op)
    assert (pool_status(api)["generation"], pool_status(api)["assignment"]) == (1, [0, 0, 0, 0])
    up = pools.plan([0, 0, 0, 0], 2)
    moved = [m.partition for m in up]
    assert moved == [2, 3]
    loads = [Load(kafka, interval_s=0.08) for _ in moved]
    for load, partition in zip(loads, moved, strict=True):
        load.start(partition)

    with Owners(pods) as owners:
        time.sleep(1.0)
        started = time.monotonic()
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        wait_for("1 -> 2", lambda: at_size(api, 2), timeout_s=SCALE_S, operator=op)
        up_s = time.monotonic() - started
        assert pool_status(api)["assignment"] == [0, 0, 1, 1]
        assert api.get("statefulsets", NAMESPACE, STS)["spec"]["replicas"] == 2
        assert all(load.still_sending() for load in loads)  # the moves ran under the load

        started = time.monotonic()
        api.patch(POOL_PATH, {"spec": {"replicas": 1}})
        wait_for("2 -> 1", lambda: at_size(api, 1), timeout_s=SCALE_S, operator=op)
        wait_for("pod 1 stopped", lambda: pods.urls().keys() == {0}, timeout_s=60)
        down_s = time.monotonic() - started
        time.sleep(0.5)
    acknowledged: dict[str, list[str]] = {}
    for load in loads:
        acknowledged.update(load.finish())

    status = pool_status(api)
    assert status["assignment"] == [0, 0, 0, 0]
    assert status["generation"] > 1
    assert condition(status, "Migrating")["status"] == "False"
    # The StatefulSet went up before the moves and down after them: 1, 2, 1.
    assert [p["spec"]["replicas"] for p in api.sent("PATCH", "statefulsets") if "spec" in p] == [
        2,
        1,
    ]
    assert pods.started == [0, 1]
    assert pods.stopped == [1]

    found = moves_of(api)
    assert len(found) == 4, sorted(found)
    lines = released(found)
    # Up: partition order; down: the highest ordinal emptied (it is the only one above 0).
    order = [
        (m["spec"]["partition"], m["spec"]["toOrdinal"])
        for m in sorted(found.values(), key=lambda m: m["spec"]["generation"])
    ]
    assert order == [(2, 1), (3, 1), (2, 0), (3, 0)]

    assert owners.overlaps == [], owners.overlaps[:3]
    assert any(serving.get(1) == [2, 3] for serving in owners.seen)  # 1 did serve them
    sent = sum(len(load.sent) for load in loads)
    assert sum(map(len, acknowledged.values())) == sent > 40  # every SEND answered 201
    final = pods.urls()[0]
    for partition, load in zip(moved, loads, strict=True):
        held = bodies(final, partition)
        assert held == {q: acknowledged[q] for q, _ in load.queues}, partition
    print(f"\n1->2 in {up_s:.1f} s, 2->1 in {down_s:.1f} s, {sent} sends; " + "; ".join(lines))

    # An operator keeping finished moves for no time deletes the four, and the pool stays put.
    op.kill()
    op = operator(RELAY_OPERATOR_MOVE_RETENTION_S="0")
    wait_for("the finished moves deleted", lambda: not moves_of(api), operator=op)
    time.sleep(2.5)  # a few more ticks: nothing is planned again
    assert not moves_of(api)
    assert (pool_status(api)["assignment"], pool_status(api)["generation"]) == (
        [0, 0, 0, 0],
        status["generation"],
    )
    assert condition(pool_status(api), "ScaleBlocked")["status"] == "False"


def status_of(body: Any) -> dict[str, Any]:
    return dict(body.get("status") or {}) if isinstance(body, dict) else {}


def test_an_operator_killed_mid_move_resumes_it_from_the_status(
    api: kube.Served,
    pods: StatefulSetStandIn,
    kafka: helpers.Kafka,
    operator: Callable[..., Operator],
) -> None:
    """SIGKILL while a move's status write is being retried (injected 409 and 500 answers):
    after its commit, the next operator commits again (idempotent) and releases; mid-pause, the
    next one finds the pause past its budget and rolls back, then plans the move again."""
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port)
    committed = api.call(
        lambda server: server.inject(
            "PATCH",
            "relaypartitionmoves",
            [409, 500, 500, 500, 500],
            subresource="status",
            when=lambda body: status_of(body).get("installed") is True,
        )
    )
    op = operator()
    wait_for("the adoption", lambda: pool_status(api).get("assignment"), operator=op)
    loads = [Load(kafka, interval_s=0.08) for _ in (2, 3)]
    for load, partition in zip(loads, (2, 3), strict=True):
        load.start(partition)
    with Owners(pods) as owners:
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        wait_for(
            "the commit's status write refused twice", lambda: len(committed.hits) >= 2, 90, op
        )
        op.kill()  # p2 committed on the target; its status still says Committed, not installed
        assert "answered 409; trying again" in op.text()
        api.call(lambda server: committed.statuses.clear())
        first = moves_of(api)["queue-writer-g2-p2"]["status"]
        assert (first["phase"], first.get("installed")) == ("Committed", None)
        paused = api.call(
            lambda server: server.inject(
                "PATCH",
                "relaypartitionmoves",
                [500, 500, 500, 500, 500],
                subresource="status",
                when=lambda body: status_of(body).get("phase") == "CatchingUp",
            )
        )
        op = operator()
        wait_for("the pause's status write refused", lambda: len(paused.hits) >= 2, 90, op)
        op.kill()  # p3's source paused; its status still says Paused
        api.call(lambda server: paused.statuses.clear())
        assert moves_of(api)["queue-writer-g4-p3"]["status"]["phase"] == "Paused"
        op = operator()
        wait_for("1 -> 2", lambda: at_size(api, 2), timeout_s=SCALE_S, operator=op)
        time.sleep(0.5)
    acknowledged: dict[str, list[str]] = {}
    for load in loads:
        acknowledged.update(load.finish())

    found = moves_of(api)
    released = found["queue-writer-g2-p2"]["status"]
    assert released["phase"] == "Released"
    rolled = found["queue-writer-g4-p3"]["status"]
    assert rolled["phase"] == "RolledBack"
    assert "past its budget" in rolled["message"]
    again = [m for n, m in found.items() if n not in ("queue-writer-g2-p2", "queue-writer-g4-p3")]
    assert [(m["spec"]["partition"], m["status"]["phase"]) for m in again] == [(3, "Released")]
    assert again[0]["spec"]["generation"] > 5  # above the rollback's generation 5
    status = pool_status(api)
    assert (status["assignment"], status["rollbacks"]) == ([0, 0, 1, 1], 1)
    assert owners.overlaps == [], owners.overlaps[:3]
    sent = sum(len(load.sent) for load in loads)
    assert sum(map(len, acknowledged.values())) == sent > 20
    urls = pods.urls()
    for partition, load in zip((2, 3), loads, strict=True):
        assert bodies(urls[1], partition) == {q: acknowledged[q] for q, _ in load.queues}
    print(
        f"\nresumed after kills: p2 pause {released['pauseMs']:.0f} ms (includes the restart), "
        f"p3 rolled back ({rolled['message']}), then pause {again[0]['status']['pauseMs']:.0f} ms"
    )


def _approve(api: kube.Served, name: str) -> None:
    api.patch(
        f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypartitionmoves/{name}",
        {"metadata": {"annotations": {"relay.dev/approved": "true"}}},
    )


def test_manual_moves_wait_for_approval_and_a_failed_one_blocks_until_deleted(
    api: kube.Served,
    pods: StatefulSetStandIn,
    operator: Callable[..., Operator],
) -> None:
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port, approval="Manual", moveTimeoutSeconds=5)
    op = operator(RELAY_OPERATOR_PREFETCH_TIMEOUT_S="1")
    wait_for("the adoption", lambda: pool_status(api).get("assignment"), operator=op)
    with Owners(pods) as owners:
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        wait_for(
            "moves awaiting approval",
            lambda: condition(pool_status(api), "ScaleBlocked").get("reason") == "AwaitingApproval",
            timeout_s=60,
            operator=op,
        )
        # The StatefulSet went up and its new pod is Ready; nothing moved.
        assert pods.ready() == [0, 1]
        assert sorted(moves_of(api)) == ["queue-writer-g2-p2", "queue-writer-g4-p3"]
        assert "relay.dev/approved=true" in condition(pool_status(api), "ScaleBlocked")["message"]
        _approve(api, "queue-writer-g4-p3")  # the second: moves run in order, so nothing runs
        time.sleep(2.5)
        assert {n: m["status"]["phase"] for n, m in moves_of(api).items()} == {
            "queue-writer-g2-p2": "Planned",
            "queue-writer-g4-p3": "Planned",
        }
        assert pool_status(api)["assignment"] == [0, 0, 0, 0]

        pods.freeze(1)  # the target hangs: its prefetch never answers
        _approve(api, "queue-writer-g2-p2")
        wait_for(
            "the move Failed",
            lambda: moves_of(api)["queue-writer-g2-p2"]["status"]["phase"] == "Failed",
            timeout_s=60,
            operator=op,
        )
        failed = moves_of(api)["queue-writer-g2-p2"]["status"]
        assert "prefetch did not succeed within 5 s" in failed["message"]
        blocked = wait_for(
            "ScaleBlocked",
            lambda: condition(pool_status(api), "ScaleBlocked").get("reason") == "MoveFailed",
            operator=op,
        )
        assert blocked
        assert "queue-writer-g2-p2" in condition(pool_status(api), "ScaleBlocked")["message"]
        assert pool_status(api)["assignment"] == [0, 0, 0, 0]
        # A prefetch fences nothing: ordinal 0 served every partition throughout.
        answer = httpx.get(f"{pods.urls()[0]}/internal/ownership", headers=AUTH, timeout=5)
        assert answer.json()["serving"] == [0, 1, 2, 3]
        time.sleep(2)
        assert moves_of(api)["queue-writer-g4-p3"]["status"]["phase"] == "Planned"  # blocked

        # A person looks, the pod answers again, puts the partitions right (here: a newer
        # generation installed on both pods, the owners as they are), deletes the move: the
        # pool adopts that generation from its pods and plans anew above it.
        pods.freeze(1, frozen=False)
        right = {"generation": 10, "partitions": PARTITIONS, "replicas": 2}
        for url in (pods.urls()[1], pods.urls()[0]):
            put = httpx.put(
                f"{url}/internal/ownership",
                json={**right, "assignment": [0, 0, 0, 0]},
                headers=AUTH,
                timeout=30,
            )
            assert put.status_code == 200, put.text
        api.delete(
            f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypartitionmoves/"
            "queue-writer-g2-p2"
        )

        def approved_all() -> bool:
            for name, move in moves_of(api).items():
                annotations = move["metadata"].get("annotations") or {}
                if (move.get("status") or {}).get("phase") == "Planned" and not annotations:
                    _approve(api, name)
            return at_size(api, 2)

        wait_for("1 -> 2 after the new plan", approved_all, timeout_s=SCALE_S, operator=op)
    found = moves_of(api)
    assert "queue-writer-g2-p2" not in found
    done = sorted(
        (m["spec"]["partition"], m["spec"]["generation"])
        for m in found.values()
        if m["status"]["phase"] == "Released"
    )
    # Planned again above the generation the pods reported (10), not the pool's own (4).
    assert [p for p, _ in done] == [2, 3]
    assert all(g > 10 for _, g in done), done
    assert pool_status(api)["assignment"] == [0, 0, 1, 1]
    assert owners.overlaps == []


HELD_AT: dict[str, Callable[[dict[str, Any]], bool]] = {
    # The status write before the step's call (the phase names the step being run).
    "prefetched": lambda status: status.get("phase") == "Paused",
    "paused": lambda status: status.get("phase") == "CatchingUp",
    "caught-up": lambda status: status.get("phase") == "Committed" and not status.get("installed"),
    "committed": lambda status: (
        status.get("phase") == "Committed" and bool(status.get("installed"))
    ),
}
"""Where a move is held (its status write refused) while a pod is killed: after the target's
prefetch (before the pause), after the source's pause (before the catch-up), after the
catch-up (before the commit), after the commit (before the release)."""


@pytest.mark.parametrize(
    ("victim", "held"),
    [
        ("source", "paused"),
        ("target", "paused"),
        ("target", "prefetched"),
        ("target", "caught-up"),
        ("source", "committed"),
    ],
)
def test_a_pod_killed_at_a_step_of_a_move_loses_nothing(
    victim: str,
    held: str,
    api: kube.Served,
    pods: StatefulSetStandIn,
    kafka: helpers.Kafka,
    operator: Callable[..., Operator],
) -> None:
    """SIGKILL of the source or the target at a step of the move of partition 2 (the operator
    held there by refused status writes). Before the commit the move either rolls back (the pod
    not back within the budget: the catch-up cannot succeed, or the restarted target took the
    partition up itself) and the pool's new plan moves the partition, or the pod came back with
    its durable state, the digests agree and it commits; from the commit on it only goes
    forward, each call retried until the pod is back (at a new pod IP, which the operator reads
    again). Every acknowledged SEND is held by the owner at the end, and no two instances ever
    serve the partition."""
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port)
    at = HELD_AT[held]
    hold = api.call(
        lambda server: server.inject(
            "PATCH",
            "relaypartitionmoves",
            [500, 500, 500],
            subresource="status",
            when=lambda body: at(status_of(body)),
        )
    )
    op = operator()
    wait_for("the adoption", lambda: pool_status(api).get("assignment"), operator=op)
    load = Load(kafka, interval_s=0.05)
    load.start(2)
    with Owners(pods) as owners:
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        deadline = time.monotonic() + 90
        while not api.call(lambda server: hold.hits):
            assert time.monotonic() < deadline, op.text()[-3000:]
            time.sleep(0.02)
        pods.kill(0 if victim == "source" else 1)
        api.call(lambda server: hold.statuses.clear())
        wait_at_size(api, 2, op)
        time.sleep(0.5)
    acknowledged = load.finish()

    found = moves_of(api)
    ran = sorted(
        (m["spec"]["generation"], m["spec"]["partition"], m["status"])
        for m in found.values()
        if m["status"]["phase"] != "Planned"
    )
    first = ran[0][2]
    if first["phase"] == "RolledBack":
        # The usual outcome before the commit: the killed pod was not back within the budget.
        assert held in ("prefetched", "paused"), first  # a committed move never rolls back
        assert first["rollbackStep"] == 4
        assert first["message"].startswith("rolled back: "), first["message"]
        assert [(p, st["phase"]) for _, p, st in ran[1:]] == [(2, "Released"), (3, "Released")]
        outcome = f"rolled back ({first['message']}), then moved again"
    else:
        # A pod back within the budget with its durable state, or a step past the commit.
        assert [(p, st["phase"]) for _, p, st in ran] == [(2, "Released"), (3, "Released")]
        if held in ("prefetched", "paused"):
            assert first["catchUpMs"] <= BUDGET_S * 1000
        outcome = (
            f"released (catch-up at {first['catchUpMs']:.0f} ms, pause {first['pauseMs']:.0f} ms)"
        )
    assert pool_status(api)["assignment"] == [0, 0, 1, 1]
    killed = 0 if victim == "source" else 1
    assert pods.started.count(killed) == 2  # it did restart, at a new pod IP: the operator
    assert pods.urls()[killed] == f"http://127.0.1.{10 + killed}:{pods.port}"  # found it there
    assert owners.overlaps == [], owners.overlaps[:3]
    assert sum(map(len, acknowledged.values())) == len(load.sent) > 20
    differs = same_bodies(bodies(pods.urls()[1], 2), {q: acknowledged[q] for q, _ in load.queues})
    assert not differs, differs
    print(f"\n{victim} killed, the move held {held}: {outcome}; {len(load.sent)} sends")
