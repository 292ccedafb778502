"""Exactly-once sends under SIGKILL (API.md `Idempotency-Key`), with real processes: an ingress,
a queue-writer and the Apache Kafka broker. The queue-writer is SIGKILLed the moment its WAL
holds a keyed SEND's message (an inotify watch on its WAL folder wakes the test on the write the
group commit makes before its fdatasync; the reply is posted only after that fdatasync), so the
client gets 503 — the case under test, which must say that the message may have been stored —
or, when the reply slipped out first, 201. Either way, once the queue-writer is back, the
client's retry with the same key answers the stored message's msg_id and the queue holds it
once."""

from __future__ import annotations

import ctypes
import os
import secrets
import select
import signal
import struct
import threading
import time
from pathlib import Path

import httpx

from tests.api.client import Recipient
from tests.helpers import Kafka, running_service
from tests.services.test_queue_writer_idempotence import PARTITIONS, _start_writer

TRIALS = 12
"""Most kills tried; the test stops after two that landed before the reply."""
IN_MODIFY = 0x2
_libc = ctypes.CDLL(None, use_errno=True)


class WalWatch:
    """Wakes on every write to a file in the queue-writer's WAL folder (inotify)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, ctypes.get_errno()
        assert _libc.inotify_add_watch(self.fd, str(folder).encode(), IN_MODIFY) >= 0

    def wait_for(self, marker: bytes, timeout_s: float) -> bool:
        """True once a WAL segment holds `marker` (checked after each write event)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                while True:
                    try:
                        data = os.read(self.fd, 65536)
                    except BlockingIOError:
                        break
                    if len(data) < struct.calcsize("iIII"):
                        break
            if any(marker in path.read_bytes() for path in self.folder.glob("wal-*.log")):
                return True
        return False

    def close(self) -> None:
        os.close(self.fd)


def _send_in_thread(
    http: httpx.Client, sender: str, body: str, headers: dict[str, str]
) -> tuple[threading.Thread, list[httpx.Response]]:
    answer: list[httpx.Response] = []

    def send() -> None:
        answer.append(http.post(f"/v1/send/{sender}", json={"body": body}, headers=headers))

    sending = threading.Thread(target=send)
    sending.start()
    return sending, answer


def _walk(r: Recipient) -> list[tuple[str, str]]:
    """Every message of the queue (msg_id, b64u body), acking each, in order."""
    seen = []
    head = r.call("GET", "/head")
    while head.status_code == 200:
        message = head.json()
        seen.append((message["msg_id"], message["body"]))
        head = r.call("POST", "/ack", {"msg_id": message["msg_id"]})
    assert head.status_code == 204, head.text
    return seen


def test_a_keyed_send_whose_writer_dies_before_replying_is_stored_once(
    kafka: Kafka, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **kafka.env(),
        "RELAY_KAFKA__PARTITIONS": str(PARTITIONS),
        "RELAY_REDIS_URL": redis_url,
        "RELAY_REQUEST_TIMEOUT_S": "3",
    }
    writer_env = {**env, "RELAY_DATA__DIR": str(tmp_path / "qw")}
    writer, _ = _start_writer(writer_env)
    outcomes: list[int] = []
    try:
        with (
            running_service("relay-ingress", **env) as ingress,
            httpx.Client(base_url=ingress, timeout=30) as http,
        ):
            r = Recipient(http).create()
            watch = WalWatch(tmp_path / "qw" / "journal" / "wal")
            try:
                for trial in range(TRIALS):
                    body = f"trial-{trial}-{secrets.token_hex(8)}".encode()
                    key = {"Idempotency-Key": f"send-{trial}-{secrets.token_hex(4)}"}
                    sending, answer = _send_in_thread(http, r.sender, r.b64(body), key)
                    assert watch.wait_for(body, timeout_s=20), "the send never reached the WAL"
                    os.kill(writer.pid, signal.SIGKILL)
                    writer.wait()
                    sending.join(30)
                    (first,) = answer
                    outcomes.append(first.status_code)
                    if first.status_code == 503:
                        detail = first.json()["detail"]
                        assert "may have been stored" in detail, detail
                        assert "same Idempotency-Key is safe" in detail, detail
                    else:
                        assert first.status_code == 201, first.text
                    writer, _ = _start_writer(writer_env)
                    retry = http.post(
                        f"/v1/send/{r.sender}", json={"body": r.b64(body)}, headers=key
                    )
                    assert retry.status_code == 201, retry.text
                    if first.status_code == 201:
                        assert retry.json() == first.json()
                    stored = _walk(r)
                    assert stored == [(retry.json()["msg_id"], r.b64(body))], (
                        trial,
                        outcomes,
                    )
                    if outcomes.count(503) >= 2:
                        break
            finally:
                watch.close()
    finally:
        writer.kill()
        writer.wait()
    # The case under test happened: a kill before the reply, a 503, and still one copy.
    assert 503 in outcomes, outcomes
