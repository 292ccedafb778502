"""Exactly-once sends under SIGKILL (API.md `Idempotency-Key`, decision 0016): senders that
retry every unanswered SEND (503, a dropped connection) with the same key until it is answered,
through two ingresses, while the queue-writers and an ingress are killed in turn (relayctl
restarts them). Afterwards every queue holds each message exactly once, in order, under the
msg_id its 201 named — however many of its sends were cut off between fsync and reply."""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from tests import helpers
from tests.api.client import Recipient

pytestmark = pytest.mark.suite

QUEUES = 8
MESSAGES = 60
"""Per queue, under the quota (128): nobody reads during the load."""
KILL_EVERY_S = 2.5
VICTIMS = [
    "relay-queue-writer-0",
    "relay-queue-writer-1",
    "relay-ingress-0",
    "relay-queue-writer-0",
    "relay-queue-writer-1",
    "relay-queue-writer-0",
]


async def _sender(
    r: Recipient, urls: list[str], sent: dict[str, list[str]], retried: dict[str, int]
) -> None:
    async with httpx.AsyncClient(timeout=20) as http:
        for n in range(MESSAGES):
            body = {"body": r.b64(f"{r.queue}:{n}".encode())}
            key = {"Idempotency-Key": f"m-{n}"}
            while True:
                try:
                    response = await http.post(
                        f"{random.choice(urls)}/v1/send/{r.sender}", json=body, headers=key
                    )
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code == 201:
                    sent[r.queue].append(response.json()["msg_id"])
                    break
                if response is not None:
                    assert response.status_code == 503, response.text
                retried[r.queue] += 1
                await asyncio.sleep(0.2)
            await asyncio.sleep(random.uniform(0.05, 0.2))


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


def test_every_send_is_stored_once_under_kills(tmp_path: Path, kafka: helpers.Kafka) -> None:
    args = ["--port", "0", "--ingress", "2", "--queue-writers", "2"]
    with helpers.suite(tmp_path, *args, kafka=kafka) as running:
        urls = running.ingress_urls()
        http = httpx.Client(base_url=urls[0], timeout=20)
        recipients = [Recipient(http).create() for _ in range(QUEUES)]
        sent: dict[str, list[str]] = defaultdict(list)
        retried: dict[str, int] = defaultdict(int)
        kills: list[str] = []

        async def main() -> None:
            senders = asyncio.gather(*(_sender(r, urls, sent, retried) for r in recipients))
            for name in VICTIMS:
                await asyncio.sleep(KILL_EVERY_S)
                child = next(c for c in running.state.children if c.name == name)
                assert child.pid is not None
                os.kill(child.pid, signal.SIGKILL)
                kills.append(name)
            await asyncio.wait_for(senders, 180)

        asyncio.run(main())
        assert kills == VICTIMS
        assert sum(retried.values()) > 0, "no send was cut off: the kills missed every SEND"
        for r in recipients:
            stored = _walk(r)
            bodies = [f"{r.queue}:{n}".encode() for n in range(MESSAGES)]
            assert [body for _, body in stored] == [r.b64(b) for b in bodies], r.queue
            assert [msg_id for msg_id, _ in stored] == sent[r.queue]
        print(f"retries {sum(retried.values())}, kills {len(kills)}")  # for the issue note
