"""API.md Queues over REST, endpoint by endpoint, against the running suite."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from tests import helpers
from tests.api.client import Recipient, b64u, unb64u

pytestmark = pytest.mark.suite


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code
    assert isinstance(response.json()["detail"], str)


def test_create_queue(http: httpx.Client) -> None:
    r = Recipient(http).create()
    assert len(unb64u(r.queue)) == 24
    assert len(unb64u(r.sender)) == 24
    assert r.queue != r.sender
    response = http.post("/v1/queues", json={"recipient_key": Recipient(http).key})
    assert response.json()["quota"] == 128
    for bad in [{}, {"recipient_key": "short"}, {"recipient_key": b64u(b"x" * 31)}, []]:
        _error(http.post("/v1/queues", json=bad), 400, "BAD_REQUEST")
    _error(http.post("/v1/queues", content=b"{not json"), 400, "BAD_REQUEST")


def test_send_and_receive_in_order(http: httpx.Client) -> None:
    r = Recipient(http).create()
    sent = []
    for i in range(3):
        response = r.send(f"m{i}".encode())
        assert response.status_code == 201, response.text
        assert set(response.json()) == {"msg_id", "ts"}
        assert len(unb64u(response.json()["msg_id"])) == 24
        sent.append(response.json())
    info = r.call("GET")
    assert info.status_code == 200
    assert info.json()["size"] == 3
    assert info.json()["status"] == "active"
    assert info.json()["quota"] == 128
    assert abs(info.json()["created_at"] - time.time() * 1000) < 60_000
    head = r.call("GET", "/head")
    assert head.status_code == 200
    assert head.json() == {"msg_id": sent[0]["msg_id"], "ts": sent[0]["ts"], "body": b64u(b"m0")}
    assert r.call("GET", "/head").json() == head.json()  # in flight until ACK: the same one
    _error(r.call("POST", "/ack", {"msg_id": sent[1]["msg_id"]}), 404, "NO_MSG")
    for i in (1, 2):
        acked = r.call("POST", "/ack", {"msg_id": sent[i - 1]["msg_id"]})
        assert acked.status_code == 200
        assert acked.json()["msg_id"] == sent[i]["msg_id"]
    last = r.call("POST", "/ack", {"msg_id": sent[2]["msg_id"]})
    assert last.status_code == 204
    assert r.call("GET", "/head").status_code == 204


def test_send_refusals(http: httpx.Client) -> None:
    r = Recipient(http).create()
    _error(http.post(f"/v1/send/{b64u(bytes(24))}", json={"body": "aGk"}), 404, "NOT_FOUND")
    _error(r.send(b"x" * 16385), 413, "TOO_LARGE")
    assert r.send(b"x" * 16384).status_code == 201
    _error(http.post(f"/v1/send/{r.sender}", json={"body": "!!"}), 400, "BAD_REQUEST")
    _error(r.send(ttl_s=0), 400, "BAD_REQUEST")
    _error(http.post("/v1/send/short", json={"body": "aGk"}), 400, "BAD_REQUEST")
    assert r.call("GET").json()["size"] == 1  # refused sends stored nothing


def test_quota_then_one_marker_after_the_queue_drains(http: httpx.Client) -> None:
    r = Recipient(http).create()
    ids = [r.send(b"q").json()["msg_id"] for _ in range(128)]
    _error(r.send(), 429, "QUOTA")
    _error(r.send(), 429, "QUOTA")
    received = []
    message = r.call("GET", "/head")
    while message.status_code == 200:
        received.append(message.json())
        message = r.call("POST", "/ack", {"msg_id": message.json()["msg_id"]})
    assert [m["msg_id"] for m in received[:128]] == ids
    assert len(received) == 129
    assert set(received[128]) == {"msg_id", "ts", "quota"}
    assert received[128]["quota"] is True
    assert r.send().status_code == 201  # drained: accepted again


def test_signatures(http: httpx.Client) -> None:
    r = Recipient(http).create()
    path = f"/v1/queues/{r.queue}"
    stranger = Recipient(http)
    old = int(time.time()) - 301
    for headers in [
        {},
        {"X-Relay-Timestamp": str(int(time.time()))},
        r.headers("GET", path, ts=old),
        r.headers("GET", path + "/head"),  # signed for another path
        r.headers("POST", path),  # another method
        stranger.headers("GET", path),  # another key
        {**r.headers("GET", path), "X-Relay-Signature": "bm90IGEgc2lnbmF0dXJl"},
    ]:
        _error(http.get(path, headers=headers), 401, "AUTH")
    body = b'{"msg_id": "' + b"A" * 32 + b'"}'
    tampered = r.headers("POST", path + "/ack", body.replace(b"A", b"B", 1))
    tampered["Content-Type"] = "application/json"
    _error(http.post(path + "/ack", content=body, headers=tampered), 401, "AUTH")


def test_unknown_and_existing_queues_are_refused_alike(http: httpx.Client) -> None:
    """No endpoint tells whether a recipient id exists without a valid signature."""
    real = Recipient(http).create()
    ghost = Recipient(http)
    ghost.queue = b64u(bytes(range(24)))
    stranger = Recipient(http)
    for suffix, method in [("", "GET"), ("/head", "GET"), ("/suspend", "POST"), ("", "DELETE")]:
        answers = []
        for queue in (real.queue, ghost.queue):
            path = f"/v1/queues/{queue}{suffix}"
            response = http.request(method, path, headers=stranger.headers(method, path))
            answers.append((response.status_code, response.json()))
        assert answers[0] == answers[1]
        assert answers[0][0] == 401


def test_suspend_refuses_sends_and_lets_the_recipient_drain(http: httpx.Client) -> None:
    r = Recipient(http).create()
    msg_id = r.send().json()["msg_id"]
    suspended = r.call("POST", "/suspend")
    assert suspended.status_code == 200
    _error(r.send(), 403, "FORBIDDEN")
    assert r.call("GET").json()["status"] == "suspended"
    assert r.call("GET", "/head").json()["msg_id"] == msg_id
    assert r.call("POST", "/ack", {"msg_id": msg_id}).status_code == 204


def test_delete(http: httpx.Client) -> None:
    r = Recipient(http).create()
    r.send()
    assert r.call("DELETE").status_code == 204
    _error(r.call("GET"), 401, "AUTH")
    _error(r.send(), 404, "NOT_FOUND")


def test_expired_messages_are_never_delivered(http: httpx.Client) -> None:
    r = Recipient(http).create()
    short = r.send(b"short", ttl_s=1).json()
    keep = r.send(b"long").json()["msg_id"]
    deadline = time.monotonic() + 10
    while (head := r.call("GET", "/head").json()["msg_id"]) != keep:
        # Handed out while alive; never once its ttl has passed.
        assert head == short["msg_id"]
        assert time.time() * 1000 < short["ts"] + 2000, "an expired message was handed out"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert r.call("GET", "/head").json()["msg_id"] == keep


def test_every_error_has_the_api_shape(http: httpx.Client) -> None:
    for response in [
        http.get("/v1/nothing-here"),
        http.put("/v1/queues"),
        http.post("/v1/queues", content=b"[1,2"),
        http.get("/admin/ping"),
    ]:
        assert set(response.json()) == {"error", "detail"}, response.text


def test_queue_stats_over_admin_and_relayctl(http: httpx.Client, running: helpers.Running) -> None:
    auth = {"Authorization": f"Bearer {running.token()}"}
    before = http.get("/admin/queues/stats", headers=auth).json()["total"]
    r = Recipient(http).create()
    r.send(b"x" * 100)
    r.send(b"y" * 100)
    after = http.get("/admin/queues/stats", headers=auth)
    assert after.status_code == 200
    (writer,) = after.json()["writers"]
    assert writer["partitions"] == list(range(8))
    total = after.json()["total"]
    assert total["queues"] == before["queues"] + 1
    assert total["messages"] == before["messages"] + 2
    assert total["bytes"] >= before["bytes"] + 200
    assert total["open_queues"] >= 1
    _error(http.get("/admin/queues/stats"), 403, "FORBIDDEN")
    shown = subprocess.run(
        [str(helpers.BIN / "relayctl"), "queue", "stats", "--data-dir", str(running.data_dir)],
        capture_output=True,
        text=True,
        check=False,
        env=helpers.service_env(),
    )
    assert shown.returncode == 0, shown.stderr
    assert "queue-writer-0" in shown.stdout
    assert f" {total['messages']} " in shown.stdout.split("total")[1]
