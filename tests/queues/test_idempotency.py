"""Exactly-once sends (API.md `Idempotency-Key`): the key rules, and the queue-writer's rules
over a real journal and store log through random sends, retries (the same key with any body),
producer duplicates (the same msg_id), acks, restarts and time passing: a send is stored once
and every retry within the window is answered with the first send's msg_id and ts."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from relay_bus import schemas
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import idempotency, ids
from relay_queues.writer import QueueRules
from relay_storelog.store import StoreLog, StoreLogSettings
from tests.queues.test_writer import Recipient

KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"


@given(st.text(alphabet=KEY_CHARS, min_size=1, max_size=64))
def test_well_formed_keys_are_taken_as_they_are(key: str) -> None:
    assert idempotency.check_key(key) == key


@given(
    st.text(max_size=80).filter(
        lambda k: not (1 <= len(k) <= 64 and all(c in KEY_CHARS for c in k))
    )
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="Idempotency-Key: 1 to 64 characters"):
        idempotency.check_key(key)


def test_identities_are_scoped_by_sender_and_kind() -> None:
    sender, other, msg_id = ids.SenderId(ids.new_id()), ids.SenderId(ids.new_id()), ids.new_id()
    one = idempotency.identity(sender, "order-1", msg_id)
    assert one == idempotency.identity(sender, "order-1", ids.new_id())  # the key decides
    assert len(one) == idempotency.IDENTITY_BYTES
    assert one != idempotency.identity(other, "order-1", msg_id)
    assert idempotency.identity(sender, None, msg_id) == idempotency.identity(sender, None, msg_id)
    assert idempotency.identity(sender, msg_id, "x") != idempotency.identity(sender, None, msg_id)
    with pytest.raises(ValueError, match="Idempotency-Key"):
        idempotency.identity(sender, "not a key", msg_id)


def test_a_send_record_without_a_key_still_decodes() -> None:
    """Queue commands written before `key` existed (BRIEF §4)."""
    old = (
        b'{"kind":"queue_cmd","v":2,"op":"send","id":"r1","origin":"i","reply_slot":0,'
        b'"deadline_ms":1.0,"sender":"s","msg_id":"m","body":"eA","ttl_s":null}'
    )
    record = schemas.decode(old)
    assert isinstance(record, schemas.SendMessage)
    assert record.key is None
    keyed = schemas.SendMessage.model_validate(record.model_dump() | {"key": "k-1"})
    assert schemas.decode(schemas.encode(keyed)) == keyed


WINDOW_S = 60
BODIES = [b"a", b"b"]


class ExactlyOnce(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="exactly-once-"))
        self.now = int(time.time() * 1000)
        self._open()
        self.recipients = [Recipient(), Recipient()]
        for r in self.recipients:
            assert self.writer.create(r.queue, r.sender, r.key, self.now).status == 201
        self.first: dict[tuple[str, str], tuple[str, int]] = {}
        """(sender, key or msg_id) → the first answer (msg_id, ts)."""
        self.stored: dict[str, list[str]] = {r.queue: [] for r in self.recipients}
        self.msg_ids: list[str] = []

    def _open(self) -> None:
        self.journal = QueueJournal(
            JournalSettings(
                root=self.dir / "journal",
                max_queue_messages=200,
                max_file_messages=201,
                wal_segment_bytes=8192,
                wal_spares=False,
                send_key_window_s=WINDOW_S,
            )
        )
        self.store = StoreLog(StoreLogSettings(root=self.dir / "store"))
        self.writer = QueueRules(self.journal, self.store)

    def teardown(self) -> None:
        self.journal.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _expect(self, sender: str, name: str, outcome_data: object, msg_id: str) -> None:
        first = self.first.get((sender, name))
        if first is not None and first[1] + WINDOW_S * 1000 > self.now:
            assert outcome_data == {"msg_id": first[0], "ts": first[1]}
            return
        assert outcome_data == {"msg_id": msg_id, "ts": self.now}
        self.first[sender, name] = (msg_id, self.now)
        queue = next(r.queue for r in self.recipients if r.sender == sender)
        self.stored[queue].append(msg_id)

    @rule(
        who=st.integers(0, 1), key=st.sampled_from(["k1", "k2", "k3"]), body=st.sampled_from(BODIES)
    )
    def send_with_key(self, who: int, key: str, body: bytes) -> None:
        """A client's send or retry: a new msg_id each time, the same key (any body)."""
        r, msg_id = self.recipients[who], ids.new_id()
        outcome = self.writer.send(r.sender, msg_id, body, None, self.now, key)
        assert outcome.status == 201
        self._expect(r.sender, "k:" + key, outcome.data, msg_id)

    @rule(who=st.integers(0, 1))
    def send_without_key(self, who: int) -> None:
        r, msg_id = self.recipients[who], ids.new_id()
        outcome = self.writer.send(r.sender, msg_id, b"n", None, self.now)
        assert outcome.status == 201
        self._expect(r.sender, "m:" + msg_id, outcome.data, msg_id)
        self.msg_ids.append(msg_id)

    @rule(data=st.data())
    def producer_duplicate(self, data: st.DataObject) -> None:
        """The same command again (a Kafka producer retry): its msg_id, no key."""
        if not self.msg_ids:
            return
        msg_id = data.draw(st.sampled_from(self.msg_ids))
        sender = next(s for (s, name) in self.first if name == "m:" + msg_id)
        outcome = self.writer.send(ids.SenderId(sender), msg_id, b"n", None, self.now)
        self._expect(sender, "m:" + msg_id, outcome.data, msg_id)

    @rule(who=st.integers(0, 1))
    def ack(self, who: int) -> None:
        r = self.recipients[who]
        head = self.journal.peek(r.queue)
        if head is not None:
            assert (
                self.writer.ack(r.queue, ids.b64u(head.msg_id), r.signed(), self.now).code is None
            )
            self.stored[r.queue].remove(ids.b64u(head.msg_id))

    @rule(ms=st.sampled_from([1, 5_000, WINDOW_S * 1000]))
    def time_passes(self, ms: int) -> None:
        self.now = max(self.now + ms, int(time.time() * 1000))

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:  # dropped unclosed, as a SIGKILL after the fsync leaves it
            self.journal.wal.flush()
        else:
            self.journal.close()
        self.store.close()
        self._open()

    @invariant()
    def each_send_stored_once(self) -> None:
        for queue, msg_ids in self.stored.items():
            assert [ids.b64u(m.msg_id) for m in self.journal.messages(queue)] == msg_ids


ExactlyOnce.TestCase.settings = hsettings(max_examples=30, stateful_step_count=30, deadline=None)
test_exactly_once = ExactlyOnce.TestCase


def test_a_retry_is_answered_even_when_the_queue_is_full_or_suspended(tmp_path: Path) -> None:
    """The retry changes nothing, so neither the quota (no second marker) nor a suspension
    since the first send refuses it; a new key is refused as any send would be."""
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal", max_queue_messages=2))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    try:
        rules, r, now = QueueRules(journal, store), Recipient(), int(time.time() * 1000)
        assert rules.create(r.queue, r.sender, r.key, now).status == 201
        first = rules.send(r.sender, ids.new_id(), b"1", None, now, "a")
        assert rules.send(r.sender, ids.new_id(), b"2", None, now, "b").status == 201
        assert rules.send(r.sender, ids.new_id(), b"3", None, now, "c").code == "QUOTA"
        lsn = journal.wal.written_lsn
        again = rules.send(r.sender, ids.new_id(), b"1", None, now + 1, "a")
        assert (again.status, again.data, again.events) == (201, first.data, [])
        assert journal.wal.written_lsn == lsn  # nothing logged: no second quota marker
        assert rules.suspend(r.queue, r.signed(), now).status == 200
        suspended = rules.send(r.sender, ids.new_id(), b"1", None, now + 2, "a")
        assert (suspended.status, suspended.data) == (201, first.data)
        assert rules.send(r.sender, ids.new_id(), b"4", None, now, "d").code == "FORBIDDEN"
        assert [m.body for m in journal.messages(r.queue)] == [b"1", b"2", b""]
    finally:
        journal.close()
        store.close()
