"""`Idempotency-Key` across a restart of the whole suite on the same data dir (`relayctl up`
stopped with SIGTERM, or every process SIGKILLed): a retry with the key of a send made before
answers that send's msg_id and ts, whether its message was acknowledged since or is still
queued, and stores nothing (API.md: "also across restarts of any process")."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.api.client import Recipient
from tests.helpers import suite
from tests.suite.test_restart import _kill_everything, _walk

pytestmark = pytest.mark.suite


def _send(r: Recipient, body: bytes, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return r.http.post(f"/v1/send/{r.sender}", json={"body": r.b64(body)}, headers=headers)


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL everything"])
def test_a_retry_after_a_suite_restart_answers_the_first_send(tmp_path: Path, stop: str) -> None:
    with suite(tmp_path, "--port", "0") as running:
        http = httpx.Client(base_url=running.state.ingress_url, timeout=20)
        r = Recipient(http).create()
        acked = _send(r, b"acked", "first").json()
        queued = _send(r, b"queued", "second").json()
        plain = _send(r, b"plain").json()
        head = r.call("GET", "/head").json()
        assert head["msg_id"] == acked["msg_id"]
        assert r.call("POST", "/ack", {"msg_id": acked["msg_id"]}).status_code == 200
        if stop == "SIGTERM":
            running.process.send_signal(signal.SIGTERM)
            assert running.process.wait(timeout=30) == 0
        else:
            _kill_everything(running)

    with suite(tmp_path, "--port", "0") as running:
        r.http = httpx.Client(base_url=running.state.ingress_url, timeout=20)
        for body, key, first in [
            (b"acked", "first", acked),
            (b"other body", "first", acked),
            (b"queued", "second", queued),
        ]:
            retry = _send(r, body, key)
            assert (retry.status_code, retry.json()) == (201, first)
        assert _walk(r) == [queued["msg_id"], plain["msg_id"]]
