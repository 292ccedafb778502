"""`kopf run` of the operator scaling a retainer pool 1 -> 2 -> 1 by partition moves, against real
retainer processes (tests/operator/statefulsets.py stands in for the StatefulSet controller) on
the real Apache Kafka broker, while retained publishes and durable-stream stores are put on the
moved partitions as the ingress puts them (tests/runtime/test_retainer_handoff.py's `Load`).

Checked: every acknowledged write is held by the instance that owns its partition, at size 2
and at the end (retained: each topic's last acknowledged payload; streams: every acknowledged
message, in the order sent, and nothing else); no two instances ever serve one partition
(`Owners`); each move is Released with equal digests and its pause within the budget; the
StatefulSet goes 1, 2, 1. And a retainer SIGKILLed at a step of a move loses nothing it
acknowledged."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from relay_operator import pools
from tests import helpers
from tests.operator import kube
from tests.operator.conftest import NAMESPACE, Operator, wait_for
from tests.operator.statefulsets import StatefulSetStandIn
from tests.operator.test_scale import (
    HELD_AT,
    SCALE_S,
    Owners,
    at_size,
    install,
    moves_of,
    pool_status,
    released,
    status_of,
    stood_in,
    wait_at_size,
)
from tests.runtime.test_retainer_handoff import Load, held

STS = "r1-relay-retainer"
POOL = "retainer"
POOL_PATH = f"/apis/relay.dev/v1alpha1/namespaces/{NAMESPACE}/relaypools/{POOL}"


@pytest.fixture
def pods(api: kube.Served, kafka: helpers.Kafka, tmp_path: Path) -> Iterator[StatefulSetStandIn]:
    with stood_in(api, kafka, tmp_path / "pods", POOL, STS) as standin:
        yield standin


def test_a_retainer_pool_scales_one_two_one_under_load_losing_nothing(
    api: kube.Served,
    pods: StatefulSetStandIn,
    kafka: helpers.Kafka,
    operator: Callable[..., Operator],
) -> None:
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port, service=POOL, sts=STS)
    op = operator()
    wait_for("the adoption", lambda: pool_status(api, POOL).get("assignment"), operator=op)
    assert pool_status(api, POOL)["assignment"] == [0, 0, 0, 0]
    moved = [m.partition for m in pools.plan([0, 0, 0, 0], 2)]
    assert moved == [2, 3]
    loads = [Load(kafka, partition, interval_s=0.05) for partition in moved]
    for load in loads:
        load.start()

    with Owners(pods) as owners:
        time.sleep(1.0)
        started = time.monotonic()
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        wait_for("1 -> 2", lambda: at_size(api, 2, POOL), timeout_s=SCALE_S, operator=op)
        up_s = time.monotonic() - started
        assert pool_status(api, POOL)["assignment"] == [0, 0, 1, 1]
        assert all(not load.done.is_set() for load in loads)  # the moves ran under the load
        midway = {p: held(pods.urls()[1], p) for p in moved}

        started = time.monotonic()
        api.patch(POOL_PATH, {"spec": {"replicas": 1}})
        wait_for("2 -> 1", lambda: at_size(api, 1, POOL), timeout_s=SCALE_S, operator=op)
        wait_for("pod 1 stopped", lambda: pods.urls().keys() == {0}, timeout_s=60)
        down_s = time.monotonic() - started
        time.sleep(0.5)
    acknowledged = {p: load.finish() for p, load in zip(moved, loads, strict=True)}

    assert [p["spec"]["replicas"] for p in api.sent("PATCH", "statefulsets") if "spec" in p] == [
        2,
        1,
    ]
    assert (pods.started, pods.stopped) == ([0, 1], [1])
    found = moves_of(api)
    assert len(found) == 4, sorted(found)
    lines = released(found)
    assert owners.overlaps == [], owners.overlaps[:3]
    assert any(serving.get(1) == [2, 3] for serving in owners.seen)  # 1 did serve them

    writes = sum(len(load.sent) for load in loads)
    assert writes > 80
    final = pods.urls()[0]
    for partition in moved:
        retained, streams = acknowledged[partition]
        have_retained, have_streams = held(final, partition)
        assert have_retained == retained, partition
        assert have_streams == streams, partition
        # What ordinal 1 held at size 2 is a prefix of the end: nothing it had was lost.
        mid_retained, mid_streams = midway[partition]
        assert mid_retained.keys() <= retained.keys()
        for topic, payloads in mid_streams.items():
            assert streams[topic][: len(payloads)] == payloads, (partition, topic)
    print(
        f"\nretainers 1->2 in {up_s:.1f} s, 2->1 in {down_s:.1f} s, {writes} writes; "
        + "; ".join(lines)
    )


@pytest.mark.parametrize(
    ("victim", "held_at"),
    [("source", "paused"), ("target", "paused"), ("target", "caught-up"), ("source", "committed")],
)
def test_a_retainer_killed_at_a_step_of_a_move_loses_nothing_acknowledged(
    victim: str,
    held_at: str,
    api: kube.Served,
    pods: StatefulSetStandIn,
    kafka: helpers.Kafka,
    operator: Callable[..., Operator],
) -> None:
    """SIGKILL of the source or the target at a step of the move of partition 2 (the operator
    held there by refused status writes), as `test_scale.py` does for queue-writers. A killed
    retainer's writes in hand are neither stored for sure nor answered; every acknowledged
    one is held by the owner at the end, and no two instances ever serve the partition."""
    wait_for("pod 0 Ready", lambda: pods.ready() == [0], timeout_s=60)
    install(api, pods.port, service=POOL, sts=STS)
    at = HELD_AT[held_at]
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
    wait_for("the adoption", lambda: pool_status(api, POOL).get("assignment"), operator=op)
    load = Load(kafka, 2, interval_s=0.05)
    load.start()
    with Owners(pods) as owners:
        api.patch(POOL_PATH, {"spec": {"replicas": 2}})
        deadline = time.monotonic() + 90
        while not api.call(lambda server: hold.hits):
            assert time.monotonic() < deadline, op.text()[-3000:]
            time.sleep(0.02)
        killed = 0 if victim == "source" else 1
        pods.kill(killed)
        api.call(lambda server: hold.statuses.clear())
        wait_at_size(api, 2, op, POOL)
        time.sleep(0.5)
    unanswered = load.finish_unanswered()

    ran = sorted(
        (
            m["spec"]["generation"],
            m["spec"]["partition"],
            m["status"]["phase"],
            m["status"].get("catchUpMs"),
        )
        for m in moves_of(api).values()
        if m["status"]["phase"] != "Planned"
    )
    # Before the commit: rolled back (the pod not back within the budget), then moved again,
    # or committed (back in time, with its durable state); from the commit on, only forward.
    phases = [(partition, phase) for _, partition, phase, _ in ran]
    assert phases in (
        [(2, "Released"), (3, "Released")],
        [(2, "RolledBack"), (2, "Released"), (3, "Released")],
    ), ran
    if phases[0][1] == "RolledBack":
        assert held_at == "paused", ran
    assert pool_status(api, POOL)["assignment"] == [0, 0, 1, 1]
    assert pods.started.count(killed) == 2
    assert owners.overlaps == [], owners.overlaps[:3]
    assert len(load.sent) > 20
    differs = load.differences(held(pods.urls()[1], 2))
    assert not differs, differs
    print(
        f"\nretainer {victim} killed, the move held at {held_at}: (generation, partition, "
        f"phase, catch-up ms) {ran}; "
        f"{len(load.sent)} writes, {unanswered} unanswered"
    )
