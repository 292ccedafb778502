"""`Idempotency-Key` on SEND at the ingress (API.md), over the loopback bus with the real
queue-writer: a malformed key is 400 and sends nothing; a retry with the same key answers the
first send whatever its body; a SEND whose reply is lost says it may have been stored, and its
retry with the same key answers the stored message's msg_id without storing a second copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_bus import schemas, topics
from relay_ingress import queues as ingress_queues
from relay_queues import ids
from tests.services.loopback import Recipient, Relay, error


async def _queue(relay: Relay) -> tuple[ids.QueueId, str]:
    created = await relay.http.post("/v1/queues", json={"recipient_key": Recipient().public})
    assert created.status_code == 201, created.text
    return ids.QueueId(created.json()["recipient_id"]), created.json()["sender_id"]


def _stored(relay: Relay, queue: ids.QueueId) -> list[tuple[str, bytes]]:
    assert relay.commands is not None
    return [(ids.b64u(m.msg_id), m.body) for m in relay.commands.rules.journal.messages(queue)]


def _commands(relay: Relay) -> int:
    return len(relay.bus.on(topics.QUEUE_COMMANDS))


@pytest.mark.parametrize(
    "headers",
    [
        [(b"Idempotency-Key", b"")],
        [(b"Idempotency-Key", b"k" * 65)],
        [(b"Idempotency-Key", b"has space")],
        [(b"Idempotency-Key", b"slash/no")],
        [(b"Idempotency-Key", b"dot.no")],
        [(b"Idempotency-Key", "caf\u00e9".encode())],
        [(b"Idempotency-Key", b"one"), (b"Idempotency-Key", b"two")],
    ],
    ids=["empty", "65-chars", "space", "slash", "dot", "non-ascii", "twice"],
)
async def test_a_malformed_key_is_400_and_sends_nothing(
    tmp_path: Path, redis_url: str, headers: list[tuple[bytes, bytes]]
) -> None:
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay)
        before = _commands(relay)
        response = await relay.http.post(
            f"/v1/send/{sender}", json={"body": ids.b64u(b"x")}, headers=headers
        )
        assert error(response) == (400, "BAD_REQUEST")
        assert "Idempotency-Key" in response.json()["detail"]
        assert _commands(relay) == before
        assert _stored(relay, queue) == []


async def test_a_retry_with_the_same_key_answers_the_first_send(
    tmp_path: Path, redis_url: str
) -> None:
    async with Relay(tmp_path, redis_url) as relay:
        queue, sender = await _queue(relay)
        _, other_sender = await _queue(relay)
        url, key = f"/v1/send/{sender}", {"Idempotency-Key": "order-42_A"}
        first = await relay.http.post(url, json={"body": ids.b64u(b"one")}, headers=key)
        assert first.status_code == 201, first.text
        # The same key, another body: the key names the send, the first one is answered.
        again = await relay.http.post(url, json={"body": ids.b64u(b"two")}, headers=key)
        assert (again.status_code, again.json()) == (201, first.json())
        plain = await relay.http.post(url, json={"body": ids.b64u(b"three")})
        other_key = {"Idempotency-Key": "order-43"}
        other = await relay.http.post(url, json={"body": ids.b64u(b"four")}, headers=other_key)
        elsewhere = await relay.http.post(
            f"/v1/send/{other_sender}", json={"body": ids.b64u(b"five")}, headers=key
        )
        answered = [r.json()["msg_id"] for r in (first, plain, other, elsewhere)]
        assert len(set(answered)) == 4
        assert _stored(relay, queue) == [
            (answered[0], b"one"),
            (answered[1], b"three"),
            (answered[2], b"four"),
        ]
        sends = [
            r for r, _ in relay.bus.on(topics.QUEUE_COMMANDS) if isinstance(r, schemas.SendMessage)
        ]
        keys = [s.key for s in sends]
        assert keys == ["order-42_A", "order-42_A", None, "order-43", "order-42_A"]


async def test_a_lost_reply_says_the_send_may_be_stored_and_its_retry_is_safe(
    tmp_path: Path, redis_url: str
) -> None:
    async with Relay(tmp_path, redis_url, request_timeout_s=0.2) as relay:
        queue, sender = await _queue(relay)
        url, key = f"/v1/send/{sender}", {"Idempotency-Key": "lost-reply"}
        relay.bus.hold(topics.INGRESS_INBOX)  # the writer stores and answers; nobody hears it
        lost = await relay.http.post(url, json={"body": ids.b64u(b"once")}, headers=key)
        assert (lost.status_code, lost.json()) == (
            503,
            {
                "error": "UNAVAILABLE",
                "detail": f"no answer within 0.2 s; {ingress_queues.SEND_UNKNOWN}",
            },
        )
        [(stored_id, body)] = _stored(relay, queue)
        assert body == b"once"
        relay.bus._held.pop(topics.INGRESS_INBOX)  # the reply is lost for good
        retry = await relay.http.post(url, json={"body": ids.b64u(b"once")}, headers=key)
        assert retry.status_code == 201, retry.text
        assert retry.json()["msg_id"] == stored_id
        assert _stored(relay, queue) == [(stored_id, b"once")]
