"""`POST /admin/dump` through a real ingress and queue-writer (issue 5): started, waited for,
and refused without the token; with no queue-writer running, a 503 naming what did not answer."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers import Kafka, running_service

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _ingress_env(kafka: Kafka, redis_url: str) -> dict[str, str]:
    return {
        **kafka.env(),
        "RELAY_KAFKA__PARTITIONS": "4",
        "RELAY_REDIS_URL": redis_url,
        "RELAY_ADMIN_TOKEN": TOKEN,
    }


def test_dump_starts_waits_and_needs_the_token(
    kafka: Kafka, redis_url: str, tmp_path: Path
) -> None:
    env = _ingress_env(kafka, redis_url)
    store = tmp_path / "qw" / "store"
    with (
        running_service(
            "relay-queue-writer",
            RELAY_DATA__DIR=str(tmp_path / "qw"),
            RELAY_DUMP_INTERVAL_S="0",
            **env,
        ),
        running_service("relay-ingress", **env) as ingress,
    ):
        refused = httpx.post(f"{ingress}/admin/dump", headers={"Authorization": "Bearer no"})
        assert (refused.status_code, refused.json()["error"]) == (403, "FORBIDDEN")
        assert not list(store.glob("store-*.dump*"))

        done = httpx.post(f"{ingress}/admin/dump?wait=true", headers=AUTH, timeout=30)
        assert done.status_code == 200, done.text
        report = done.json()
        (writer,) = report["writers"]
        assert writer["instance"] == "relay-queue-writer"
        assert writer["partitions"] == [0, 1, 2, 3]
        assert writer["dump"] == report["dump"]
        assert writer["records"] == 0
        dump_file = store / f"store-{report['dump']}.dump"
        assert dump_file.exists()
        # no queues yet: a version 2 dump is its empty indexes and footer only
        assert writer["bytes"] == dump_file.stat().st_size < 100
        assert 0 < writer["pause_ms"] <= writer["total_s"] * 1000 < 30_000

        started = httpx.post(f"{ingress}/admin/dump", headers=AUTH, timeout=30)
        assert started.status_code == 202, started.text
        assert started.json()["dump"] > report["dump"]
        assert set(started.json()["writers"][0]) == {"instance", "partitions", "dump"}


def test_dump_without_queue_writers_is_unavailable(kafka: Kafka, redis_url: str) -> None:
    with running_service("relay-ingress", **_ingress_env(kafka, redis_url)) as ingress:
        response = httpx.post(f"{ingress}/admin/dump?timeout_s=1", headers=AUTH, timeout=10)
    assert response.status_code == 503
    assert response.json() == {
        "error": "UNAVAILABLE",
        "detail": "no answer within 1 s for command partitions [0, 1, 2, 3] "
        "(is every queue-writer running?)",
    }
