"""The queue-writer's rules over a real journal and store log (API.md Queues, SMP semantics):
each command, each refusal, and that refusals change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import auth, ids
from relay_queues.delivery import Subscriber
from relay_queues.writer import QueueRules, Signed
from relay_storelog.store import StoreLog, StoreLogSettings

NOW = 1_800_000_000_000


class Recipient:
    def __init__(self) -> None:
        self.private = Ed25519PrivateKey.generate()
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key = ids.b64u(raw)
        self.queue, self.sender = ids.new_queue_ids(8)

    def signed(self, text: str = "GET\n/x\n1\n-") -> Signed:
        return Signed(text, self.private.sign(text.encode()))


@pytest.fixture
def rules(tmp_path: Path) -> Iterator[QueueRules]:
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal", max_queue_messages=3))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    yield QueueRules(journal, store)
    journal.close()
    store.close()


def _created(rules: QueueRules) -> Recipient:
    r = Recipient()
    outcome = rules.create(r.queue, r.sender, r.key, NOW)
    assert (outcome.status, outcome.data) == (
        201,
        {"recipient_id": r.queue, "sender_id": r.sender, "quota": 3},
    )
    assert outcome.seq is not None
    return r


def _send(rules: QueueRules, r: Recipient, body: bytes = b"hi", ttl_s: int | None = None) -> str:
    msg_id = ids.new_id()
    outcome = rules.send(r.sender, msg_id, body, ttl_s, NOW)
    assert outcome.status == 201, outcome
    return msg_id


def test_create_is_idempotent(rules: QueueRules) -> None:
    r = _created(rules)
    again = rules.create(r.queue, r.sender, r.key, NOW + 5)
    assert again.status == 201
    assert again.seq is None
    clash = rules.create(r.queue, ids.new_id(), r.key, NOW)
    assert clash.code == "UNAVAILABLE"


def test_send_head_ack_in_order(rules: QueueRules) -> None:
    r = _created(rules)
    first, second = _send(rules, r, b"one"), _send(rules, r, b"two")
    head = rules.head(r.queue, r.signed(), NOW)
    assert head.status == 200
    assert head.data == {"msg_id": first, "ts": NOW, "body": ids.b64u(b"one")}
    assert head.events[0].kind == "read"
    assert rules.head(r.queue, r.signed(), NOW).data == head.data  # same message until ACK
    assert rules.ack(r.queue, "é" * 32, r.signed(), NOW).code == "NO_MSG"  # not ASCII
    wrong = rules.ack(r.queue, second, r.signed(), NOW)
    assert (wrong.status, wrong.code) == (404, "NO_MSG")
    acked = rules.ack(r.queue, first, r.signed(), NOW)
    assert acked.status == 200
    assert acked.data is not None
    assert acked.data["msg_id"] == second
    assert acked.events[0].head is not None
    assert acked.events[0].head.msg_id == second
    assert rules.ack(r.queue, second, r.signed(), NOW).status == 204
    assert rules.head(r.queue, r.signed(), NOW).status == 204


def test_a_duplicated_send_is_stored_once(rules: QueueRules) -> None:
    r = _created(rules)
    msg_id = _send(rules, r)
    again = rules.send(r.sender, msg_id, b"hi", None, NOW + 9)
    assert (again.status, again.data) == (201, {"msg_id": msg_id, "ts": NOW})
    assert rules.info(r.queue, r.signed()).data == {
        "size": 1,
        "quota": 3,
        "status": "active",
        "created_at": NOW,
    }


def test_quota_refuses_and_delivers_one_marker(rules: QueueRules) -> None:
    r = _created(rules)
    sent = [_send(rules, r) for _ in range(3)]
    full = rules.send(r.sender, ids.new_id(), b"x", None, NOW)
    assert (full.status, full.code) == (429, "QUOTA")
    assert rules.send(r.sender, ids.new_id(), b"x", None, NOW).code == "QUOTA"
    seen = []
    outcome = rules.head(r.queue, r.signed(), NOW)
    while outcome.status == 200:
        assert outcome.data is not None
        seen.append(outcome.data)
        outcome = rules.ack(r.queue, outcome.data["msg_id"], r.signed(), NOW)
    assert [m["msg_id"] for m in seen[:3]] == sent
    assert len(seen) == 4
    assert seen[3]["quota"] is True
    assert "body" not in seen[3]
    _send(rules, r)  # drained: writes are accepted again


def test_refusals_change_nothing(rules: QueueRules) -> None:
    r = _created(rules)
    msg_id = _send(rules, r)
    other = Recipient()
    lsn = rules.journal.wal.written_lsn
    for outcome in [
        rules.head(r.queue, other.signed(), NOW),  # wrong key
        rules.ack(r.queue, msg_id, other.signed(), NOW),
        rules.suspend(r.queue, other.signed(), NOW),
        rules.delete(r.queue, other.signed()),
        rules.info(other.queue, other.signed()),  # unknown queue: the same answer
        rules.subscribe(r.queue, other.signed(), Subscriber(0, "c"), NOW),
    ]:
        assert (outcome.status, outcome.code, outcome.events) == (401, "AUTH", [])
    assert rules.send(ids.new_id(), ids.new_id(), b"x", None, NOW).code == "NOT_FOUND"
    assert rules.journal.wal.written_lsn == lsn
    assert rules.info(r.queue, r.signed()).data == {
        "size": 1,
        "quota": 3,
        "status": "active",
        "created_at": NOW,
    }


def test_suspend_refuses_sends_but_lets_the_recipient_drain(rules: QueueRules) -> None:
    r = _created(rules)
    msg_id = _send(rules, r)
    assert rules.suspend(r.queue, r.signed(), NOW).status == 200
    assert rules.suspend(r.queue, r.signed(), NOW).seq is None  # already suspended
    assert rules.send(r.sender, ids.new_id(), b"x", None, NOW).code == "FORBIDDEN"
    info = rules.info(r.queue, r.signed()).data
    assert info is not None
    assert info["status"] == "suspended"
    assert rules.ack(r.queue, msg_id, r.signed(), NOW).status == 204


def test_delete_removes_the_queue(rules: QueueRules, tmp_path: Path) -> None:
    r = _created(rules)
    _send(rules, r)
    deleted = rules.delete(r.queue, r.signed())
    assert deleted.status == 204
    assert deleted.events[0].kind == "deleted"
    assert rules.info(r.queue, r.signed()).code == "AUTH"
    assert rules.send(r.sender, ids.new_id(), b"x", None, NOW).code == "NOT_FOUND"
    assert not [p for p in (tmp_path / "journal" / "queues").rglob("*") if p.is_file()]


def test_expired_messages_are_not_delivered_but_an_expired_head_in_flight_can_be_acked(
    rules: QueueRules,
) -> None:
    r = _created(rules)
    first = _send(rules, r, ttl_s=1)
    second = _send(rules, r, ttl_s=1)
    third = _send(rules, r)
    head = rules.head(r.queue, r.signed(), NOW)
    assert head.data is not None
    assert head.data["msg_id"] == first
    later = NOW + 2000
    acked = rules.ack(r.queue, first, r.signed(), later)  # handed out before it expired
    assert acked.data is not None
    assert acked.data["msg_id"] == third
    assert second not in str(acked.data)


def test_subscribe_and_sweep_tell_delivery_the_head(rules: QueueRules) -> None:
    r = _created(rules)
    msg_id = _send(rules, r, ttl_s=1)
    sub = rules.subscribe(r.queue, r.signed(auth.sub_text(r.queue, 1)), Subscriber(2, "c"), NOW)
    (event,) = sub.events
    assert event.kind == "subscribed"
    assert event.subscriber == Subscriber(2, "c")
    assert event.head is not None
    assert event.head.msg_id == msg_id
    swept = list(rules.expire(NOW + 2000))
    assert [(e.queue, e.head) for e in swept] == [(r.queue, None)]
    assert rules.resync(ids.QueueId(ids.new_id()), Subscriber(0, "x"), NOW).events == []
