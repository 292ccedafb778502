"""API.md Durable streams and the `/ds` admin endpoints against a running suite with two
retainers (two sites, each owning half the publication partitions); `relayctl ds`.

Retainer 0 owns the even partitions of `relay.publications`, retainer 1 the odd ones. Its
stream store is seeded before the suite starts with one registered site that is gone, so that
`forget` has something it may forget.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relay_bus import routing
from relay_ds.tokens import Stream
from relay_streams.store import StreamStore
from tests import helpers

pytestmark = pytest.mark.suite

PARTITIONS = 8
GONE = "00112233AABBCCDD"
"""A site registered with retainer 0 before the start, never live."""


@pytest.fixture(scope="module")
def running(
    tmp_path_factory: pytest.TempPathFactory, shared_kafka: helpers.KafkaCluster
) -> Iterator[helpers.Running]:
    tmp = tmp_path_factory.mktemp("ds")
    seeded = StreamStore(tmp / "var" / "retainer-0" / "streams", node="retainer-0")
    seeded.register_site(GONE, "gone-0")
    seeded.close()
    args = ["--port", str(helpers.free_port()), "--retainers", "2"]
    with helpers.suite(tmp, *args, kafka=helpers.Kafka.fresh(shared_kafka)) as running:
        yield running


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code
    assert isinstance(response.json()["detail"], str)


def topics_on_both_owners(prefix: str, each: int = 3) -> list[str]:
    """Topics under `prefix`, `each` owned by retainer 0 and `each` by retainer 1."""
    found: dict[int, list[str]] = {0: [], 1: []}
    i = 0
    while min(len(v) for v in found.values()) < each:
        topic = f"{prefix}/dev{i}/temp"
        owner = routing.partition_of_topic(topic, PARTITIONS) % 2
        if len(found[owner]) < each:
            found[owner].append(topic)
        i += 1
    return found[0] + found[1]


def replay(
    http: httpx.Client, topic_filter: str, n: int = 100, start: int = 0
) -> list[dict[str, Any]]:
    """Every message the filter's streams hold from `start`, stream by stream in rank order."""
    params: dict[str, Any] = {"filter": topic_filter, "start": start}
    streams = http.get("/v1/ds/messages/streams", params=params)
    assert streams.status_code == 200, streams.text
    out = []
    for ranked in streams.json():
        made = http.post(
            "/v1/ds/messages/iterators",
            json={"stream": ranked["stream"], "filter": topic_filter, "start": start},
        )
        assert made.status_code == 201, made.text
        iterator = made.json()["iterator"]
        assert iterator.split(".")[0] == ranked["stream"].split(".")[0]  # routed to its owner
        while True:
            page = http.get("/v1/ds/messages/next", params={"iterator": iterator, "n": n})
            assert page.status_code == 200, page.text
            out += page.json()["messages"]
            iterator = page.json()["iterator"]
            if page.json()["end_of_stream"] or not page.json()["messages"]:
                break
    return out


def publications_sent(http: httpx.Client) -> float:
    """Records this ingress has produced to `relay.publications` (its /metrics)."""
    text = http.get("/metrics").text
    match = re.search(
        r'^relay_bus_records_produced_total\{topic="relay.publications"\} (\S+)$', text, re.M
    )
    return float(match.group(1)) if match else 0.0


# -- client API ----------------------------------------------------------------------------------


def test_store_and_replay_merge_both_owners(http: httpx.Client) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    topics = topics_on_both_owners(prefix)
    batch = [
        {"topic": topic, "payload": b64u(f"{topic}#{i}".encode()), "ts": 1_000 + i}
        for i in range(4)
        for topic in topics
    ]
    stored = http.post("/v1/ds/messages/messages", json=batch)
    assert stored.status_code == 201, stored.text
    assert stored.json() == {"stored": len(batch)}
    later = http.post("/v1/ds/messages/messages", json=[{"topic": topics[0], "payload": "aGk"}])
    assert later.status_code == 201

    streams = http.get("/v1/ds/messages/streams", params={"filter": f"{prefix}/#"}).json()
    owners = {int(s["stream"].split(".")[0]) % 2 for s in streams}
    assert owners == {0, 1}  # streams of both retainers, merged
    ranks = [tuple(s["rank"]) for s in streams]
    assert ranks == sorted(ranks)
    by_owner = {
        owner: {s["rank"][0] for s in streams if int(s["stream"].split(".")[0]) % 2 == owner}
        for owner in (0, 1)
    }
    assert not by_owner[0] & by_owner[1]  # rank X never shared across owners

    got = replay(http, f"{prefix}/#", n=3)
    assert sorted((m["topic"], m["payload"], m["ts"]) for m in got if m["ts"] < 2_000) == sorted(
        (m["topic"], m["payload"], m["ts"]) for m in batch
    )
    assert [m["payload"] for m in got if m["ts"] >= 2_000] == ["aGk"]
    for topic in topics:  # time order per topic (a topic lives in one stream)
        times = [m["ts"] for m in got if m["topic"] == topic]
        assert times == sorted(times)
    one = replay(http, topics[-1])
    assert [m["payload"] for m in one] == [b64u(f"{topics[-1]}#{i}".encode()) for i in range(4)]
    assert replay(http, f"{prefix}/+/nothing") == []
    assert http.get("/v1/ds/messages/streams", params={"filter": f"{prefix}/#"}).json() == streams
    recent = replay(http, f"{prefix}/#", start=1_003)
    assert sorted(m["ts"] for m in recent)[: len(topics)] == [1_003] * len(topics)
    assert len(recent) == len(topics) + 1


def test_next_pages_resume_and_stay_open(http: httpx.Client) -> None:
    topic = f"p{uuid.uuid4().hex[:8]}/a"
    batch = [{"topic": topic, "payload": b64u(b"%d" % i), "ts": 10 + i} for i in range(5)]
    assert http.post("/v1/ds/messages/messages", json=batch).status_code == 201
    (ranked,) = http.get("/v1/ds/messages/streams", params={"filter": topic}).json()
    iterator = http.post(
        "/v1/ds/messages/iterators", json={"stream": ranked["stream"], "filter": topic, "start": 12}
    ).json()["iterator"]
    first = http.get("/v1/ds/messages/next", params={"iterator": iterator, "n": 2}).json()
    assert [m["ts"] for m in first["messages"]] == [12, 13]
    assert first["end_of_stream"] is False
    again = http.get("/v1/ds/messages/next", params={"iterator": iterator, "n": 2}).json()
    assert again == first  # an iterator string is a value: reading it again reads the same
    rest = http.get("/v1/ds/messages/next", params={"iterator": first["iterator"]}).json()
    assert [m["ts"] for m in rest["messages"]] == [14]
    empty = http.get("/v1/ds/messages/next", params={"iterator": rest["iterator"]}).json()
    assert empty["messages"] == []
    assert empty["end_of_stream"] is False  # the current generation can still grow
    assert set(first["messages"][0]) == {"topic", "payload", "ts"}


def test_bad_input_is_refused_before_kafka_and_changes_nothing(http: httpx.Client) -> None:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}/x"
    ok = {"topic": topic, "payload": "aGk"}
    elsewhere = f"e{uuid.uuid4().hex[:8]}/x"
    assert http.post("/v1/ds/messages/messages", json=[{**ok, "topic": elsewhere}]).is_success
    (ranked,) = http.get("/v1/ds/messages/streams", params={"filter": elsewhere}).json()
    stream = ranked["stream"]
    made = http.post("/v1/ds/messages/iterators", json={"stream": stream, "filter": elsewhere})
    iterator = made.json()["iterator"]
    partition, inner = stream.split(".")
    other_db = f"{partition}." + Stream("other", 0, 1, 0).token()
    post = "/v1/ds/messages/messages"
    sent_before = publications_sent(http)
    for response in [
        http.post("/v1/ds/bad.name/messages", json=[ok]),
        http.post(post, json=[]),
        http.post(post, json=ok),
        http.post(post, content=b"[{not json"),
        http.post(post, json=[ok, {"topic": f"{prefix}/+", "payload": "aGk"}]),
        http.post(post, json=[ok, {"topic": "", "payload": "aGk"}]),
        http.post(post, json=[ok, {"topic": topic, "payload": "a"}]),
        http.post(post, json=[ok, {"topic": topic, "payload": "!!"}]),
        http.post(post, json=[ok, {"topic": topic, "payload": "aGk", "ts": -1}]),
        http.post(post, json=[{**ok, "extra": 1}]),
        http.get("/v1/ds/messages/streams", params={"filter": "a/#/b"}),
        http.get("/v1/ds/messages/streams", params={"filter": "a/b+"}),
        http.get("/v1/ds/messages/streams"),
        http.get("/v1/ds/messages/streams", params={"filter": "#", "start": -1}),
        http.get("/v1/ds/bad.name/streams", params={"filter": "#"}),
        http.post("/v1/ds/messages/iterators", json={"stream": "junk", "filter": "#"}),
        http.post("/v1/ds/messages/iterators", json={"stream": f"99.{inner}", "filter": "#"}),
        http.post(
            "/v1/ds/messages/iterators", json={"stream": f"{partition}.{inner[:-2]}", "filter": "#"}
        ),
        http.post("/v1/ds/messages/iterators", json={"stream": other_db, "filter": "#"}),
        http.post("/v1/ds/messages/iterators", json={"stream": iterator, "filter": "#"}),
        http.post("/v1/ds/messages/iterators", json={"stream": stream, "filter": "a/#/b"}),
        http.post("/v1/ds/messages/iterators", json={"stream": stream, "filter": "#", "start": -1}),
        http.get("/v1/ds/messages/next", params={"iterator": stream}),
        http.get("/v1/ds/messages/next", params={"iterator": "nope"}),
        http.get("/v1/ds/messages/next"),
        http.get("/v1/ds/other/next", params={"iterator": iterator}),
        *(
            http.get("/v1/ds/messages/next", params={"iterator": iterator, "n": n})
            for n in (0, -1, 1001, "x")
        ),
    ]:
        _error(response, 400, "BAD_REQUEST")
    big = {"topic": topic, "payload": b64u(b"x" * 16385)}
    _error(http.post(post, json=[ok, big]), 413, "TOO_LARGE")
    _error(http.post(post, json=[ok] * 1001), 413, "TOO_LARGE")
    assert publications_sent(http) == sent_before  # nothing refused reached Kafka
    assert http.get("/v1/ds/messages/streams", params={"filter": f"{prefix}/#"}).json() == []
    page = http.get("/v1/ds/messages/next", params={"iterator": iterator}).json()
    assert [m["topic"] for m in page["messages"]] == [elsewhere]


def test_unknown_database_is_not_found(http: httpx.Client) -> None:
    ok = [{"topic": "a/b", "payload": "aGk"}]
    _error(http.post("/v1/ds/nosuchdb/messages", json=ok), 404, "NOT_FOUND")
    _error(http.get("/v1/ds/nosuchdb/streams", params={"filter": "#"}), 404, "NOT_FOUND")
    stream = "0." + Stream("nosuchdb", 0, 1, 0).token()
    made = http.post("/v1/ds/nosuchdb/iterators", json={"stream": stream, "filter": "#"})
    _error(made, 404, "NOT_FOUND")


def test_acknowledged_messages_and_iterators_survive_a_retainer_kill(
    http: httpx.Client, running: helpers.Running
) -> None:
    """SIGKILL the retainer holding a topic right after a 201: relayctl restarts it, the
    messages are there and an iterator string made before the kill goes on from its place."""
    topic = next(t for t in topics_on_both_owners(f"k{uuid.uuid4().hex[:8]}", 1) if _owner(t) == 1)
    batch = [{"topic": topic, "payload": b64u(b"%d" % i), "ts": 100 + i} for i in range(3)]
    assert http.post("/v1/ds/messages/messages", json=batch).status_code == 201
    (ranked,) = http.get("/v1/ds/messages/streams", params={"filter": topic}).json()
    iterator = http.post(
        "/v1/ds/messages/iterators", json={"stream": ranked["stream"], "filter": topic}
    ).json()["iterator"]
    first = http.get("/v1/ds/messages/next", params={"iterator": iterator, "n": 1}).json()
    child = next(c for c in running.state.children if c.name == "relay-retainer-1")
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, "the retainer did not come back within 30 s"
        page = http.get("/v1/ds/messages/next", params={"iterator": first["iterator"]})
        if page.status_code == 200:
            break
        assert page.status_code == 503, page.text
        time.sleep(0.5)
    assert [m["ts"] for m in page.json()["messages"]] == [101, 102]
    assert replay(http, topic) == [
        {"topic": topic, "payload": m["payload"], "ts": m["ts"]} for m in batch
    ]


def _owner(topic: str) -> int:
    return routing.partition_of_topic(topic, PARTITIONS) % 2


# -- admin -----------------------------------------------------------------------------------------


def test_admin_endpoints_need_the_token(http: httpx.Client) -> None:
    site = "0" * 16
    for method, path in [
        ("GET", "/ds/sites"),
        ("GET", f"/ds/sites/{site}"),
        ("PUT", f"/ds/sites/{site}/forget"),
        ("GET", "/ds/storages"),
        ("GET", "/ds/storages/messages"),
        ("GET", "/ds/storages/messages/replicas"),
        ("PUT", "/ds/storages/messages/replicas"),
        ("PUT", f"/ds/storages/messages/replicas/{site}"),
        ("DELETE", f"/ds/storages/messages/replicas/{site}"),
        ("GET", "/ds/info"),
    ]:
        body = [site] if path.endswith("/replicas") and method == "PUT" else None
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = http.request(method, path, json=body, headers=headers)
            _error(response, 403, "FORBIDDEN")


def test_sites_storages_and_replica_sets(admin: httpx.Client, running: helpers.Running) -> None:
    info = admin.get("/ds/info").json()
    live = [r["site"] for r in info["retainers"]]
    assert [r["instance"] for r in info["retainers"]] == ["retainer-0", "retainer-1"]
    assert [r["partitions"] for r in info["retainers"]] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert info["this_site"] == live[0]
    a, b = live
    assert all(re.fullmatch(r"[0-9A-F]{16}", site) for site in live)
    assert admin.get("/ds/sites").json() == sorted([a, b, GONE])

    site_a = admin.get(f"/ds/sites/{a}").json()
    assert site_a["node"] == "retainer-0"
    assert site_a["up"] is True
    assert {s["id"] for s in site_a["shards"]} >= {"0", "1", "2", "3"}
    assert all(s["storage"] == "messages" for s in site_a["shards"])
    assert admin.get(f"/ds/sites/{GONE}").json() == {"node": "gone-0", "up": False, "shards": []}
    assert admin.get(f"/ds/sites/{a.lower()}").status_code == 200
    _error(admin.get("/ds/sites/0000000000000001"), 404, "NOT_FOUND")
    _error(admin.get("/ds/sites/xyz"), 400, "BAD_REQUEST")

    assert admin.get("/ds/storages").json() == ["messages"]
    storage = admin.get("/ds/storages/messages").json()
    assert storage["name"] == "messages"
    ids = [s["id"] for s in storage["shards"]]
    assert ids == ["0", "1", "2", "3", "1024", "1025", "1026", "1027"]
    assert storage["shards"][0]["replicas"] == [{"site": a, "status": "up"}]
    assert storage["shards"][4]["replicas"] == [{"site": b, "status": "up"}]
    _error(admin.get("/ds/storages/nosuchdb"), 404, "NOT_FOUND")
    _error(admin.get("/ds/storages/nosuchdb/replicas"), 404, "NOT_FOUND")

    # Refusals change nothing.
    before = admin.get("/ds/info").json()
    replicas = "/ds/storages/messages/replicas"
    for response in [
        admin.put(replicas, json=[]),
        admin.put(replicas, json=[a, "0000000000000001"]),
        admin.put(replicas, json=[a, a]),
        admin.put(replicas, json=["not-a-site"]),
        admin.put(replicas, json={"sites": [a]}),
        admin.put(f"{replicas}/0000000000000001"),
        admin.put(f"/ds/sites/{a}/forget"),  # up
    ]:
        _error(response, 400, "BAD_REQUEST")
    _error(admin.put("/ds/storages/nosuchdb/replicas", json=[a]), 404, "NOT_FOUND")
    _error(admin.put("/ds/sites/0000000000000001/forget"), 404, "NOT_FOUND")
    _error(admin.delete(f"{replicas}/{GONE}"), 404, "NOT_FOUND")  # not in the set
    _error(admin.delete(f"{replicas}/{a}"), 400, "BAD_REQUEST")  # retainer 0's only site
    assert admin.get("/ds/info").json() == before
    assert admin.get(replicas).json() == sorted([a, b])  # each retainer holds its own share

    # Changes: recorded at every retainer, shown as transitions (no data moves yet).
    ok = admin.put(replicas, json=[a, b])
    assert (ok.status_code, ok.json()) == (202, "OK")
    assert admin.get(replicas).json() == sorted([a, b])
    shard0 = admin.get("/ds/storages/messages").json()["shards"][0]
    assert shard0["transitions"] == [{"site": b, "transition": "joining"}]
    assert {"storage": "messages", "id": "0", "transition": "joining"} in admin.get(
        f"/ds/sites/{b}"
    ).json()["shards"]
    _error(admin.put(f"/ds/sites/{b}/forget"), 400, "BAD_REQUEST")  # up, in a replica set
    left = admin.delete(f"{replicas}/{b}")
    assert (left.status_code, left.json()) == (202, "OK")
    assert admin.get(replicas).json() == [a]
    shard4 = admin.get("/ds/storages/messages").json()["shards"][4]
    assert shard4["transitions"] == [
        {"site": a, "transition": "joining"},
        {"site": b, "transition": "leaving"},
    ]
    joined = admin.put(f"{replicas}/{GONE}")
    assert (joined.status_code, joined.json()) == (202, "OK")
    assert admin.get(replicas).json() == sorted([a, GONE])
    _error(admin.put(f"/ds/sites/{GONE}/forget"), 400, "BAD_REQUEST")  # in a replica set
    assert admin.delete(f"{replicas}/{GONE}").status_code == 202
    forgotten = admin.put(f"/ds/sites/{GONE}/forget")
    assert forgotten.status_code == 204
    assert GONE not in admin.get("/ds/sites").json()
    _error(admin.get(f"/ds/sites/{GONE}"), 404, "NOT_FOUND")
    assert admin.put(replicas, json=[a, b]).status_code == 202


def test_relayctl_ds(admin: httpx.Client, running: helpers.Running) -> None:
    def relayctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(helpers.BIN / "relayctl"), "ds", *args, "--data-dir", str(running.data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=helpers.service_env(),
        )

    a, b = [r["site"] for r in admin.get("/ds/info").json()["retainers"]]
    assert relayctl("set-replicas", "messages", a, b).stdout == "ok\n"
    assert relayctl("leave", "messages", b).stdout == "ok\n"
    shown = relayctl("info")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.startswith(f"THIS SITE:\n{a}\n\nSITES:\n")
    assert f"{a}    'retainer-0'" in text
    assert f"{b}    'retainer-1'" in text
    assert "\nSHARDS:\nShard" in text
    assert re.search(rf"^messages/0 +{a}$", text, re.M)
    assert re.search(rf"^messages/1024 +{b} \+{a} -{b}$", text, re.M)
    assert relayctl("join", "messages", b).stdout == "ok\n"
    assert re.search(rf"^messages/0 +{a} \+{b}$", relayctl("info").stdout, re.M)
    refused = relayctl("forget", "0000000000000001")
    assert refused.returncode == 1
    assert refused.stderr.startswith("relayctl: ds forget failed: 404")
    assert relayctl("join", "messages", "0000000000000001").returncode == 1
    assert admin.get("/ds/storages/messages/replicas").json() == sorted([a, b])
