"""A test client for the queue API, signing exactly as API.md says (independent of the
server's own helpers, so the tests check the contract, not the code against itself)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Recipient:
    """One queue's recipient: its key pair and, once created, its ids."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.private = Ed25519PrivateKey.generate()
        self.key = b64u(self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
        self.queue = ""
        self.sender = ""

    def create(self) -> Recipient:
        response = self.http.post("/v1/queues", json={"recipient_key": self.key})
        assert response.status_code == 201, response.text
        self.queue = response.json()["recipient_id"]
        self.sender = response.json()["sender_id"]
        return self

    @staticmethod
    def b64(data: bytes) -> str:
        return b64u(data)

    def sign(self, text: str) -> str:
        return b64u(self.private.sign(text.encode()))

    def headers(
        self, method: str, path: str, body: bytes = b"", ts: int | None = None
    ) -> dict[str, str]:
        ts = int(time.time()) if ts is None else ts
        text = f"{method}\n{path}\n{ts}\n{hashlib.sha256(body).hexdigest()}"
        return {"X-Relay-Timestamp": str(ts), "X-Relay-Signature": self.sign(text)}

    def call(
        self, method: str, suffix: str = "", body: dict[str, Any] | None = None
    ) -> httpx.Response:
        path = f"/v1/queues/{self.queue}{suffix}"
        raw = b"" if body is None else json.dumps(body).encode()
        headers = self.headers(method, path, raw)
        if body is not None:
            headers["Content-Type"] = "application/json"
        return self.http.request(method, path, content=raw or None, headers=headers)

    def send(self, body: bytes = b"hello", **extra: Any) -> httpx.Response:
        return self.http.post(f"/v1/send/{self.sender}", json={"body": b64u(body), **extra})

    def sub(
        self, frame_id: object = "s", ts: int | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """A SUB frame; with `session` (a HELLO's answer), bound to it."""
        ts = int(time.time()) if ts is None else ts
        text = f"SUB\n{self.queue}\n{ts}"
        frame = {"id": frame_id, "cmd": "SUB", "queue": self.queue, "ts": ts}
        return self._bind(frame, text, session)

    def ack(
        self, msg_id: str, frame_id: str = "a", ts: int | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """An ACK frame; with `session` (a HELLO's answer), bound to it."""
        ts = int(time.time()) if ts is None else ts
        text = f"ACK\n{self.queue}\n{msg_id}\n{ts}"
        frame = {"id": frame_id, "cmd": "ACK", "queue": self.queue, "msg_id": msg_id, "ts": ts}
        return self._bind(frame, text, session)

    def _bind(self, frame: dict[str, Any], text: str, session: str | None) -> dict[str, Any]:
        if session is None:
            return {**frame, "sig": self.sign(text)}
        return {**frame, "sig": self.sign(f"{text}\n{session}"), "bound": True}
