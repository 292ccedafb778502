"""The writer's events keep delivery's view of every queue true (decision 0013): a SEND behind
a head that stays sends no event, and still every head reaches the subscriber once, over a real
journal, whatever the order of sends, ACKs, expiries and sweeps."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import auth, ids
from relay_queues.delivery import Deliveries, Frame, Subscriber
from relay_queues.writer import Event, QueueOutcome, QueueRules
from relay_storelog.store import StoreLog, StoreLogSettings
from tests.queues.test_writer import NOW, Recipient, _created

SUBSCRIBER = Subscriber(0, "c")


def test_a_send_behind_a_head_that_stays_tells_delivery_nothing(tmp_path: Path) -> None:
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal", max_queue_messages=3))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    rules = QueueRules(journal, store)
    r = _created(rules)
    first = rules.send(r.sender, ids.new_id(), b"one", 1, NOW)
    (event,) = first.events
    assert event.head is not None
    assert (event.kind, event.head.body) == ("changed", ids.b64u(b"one"))
    second = rules.send(r.sender, ids.new_id(), b"two", None, NOW)
    assert (second.status, second.events) == (201, [])
    assert second.lsn is not None
    assert first.lsn is not None
    assert second.lsn > first.lsn  # the answer still waits for its own write
    # The head expired meanwhile: this send's peek drops it, and delivery hears of the new head.
    third = rules.send(r.sender, ids.new_id(), b"three", None, NOW + 2000)
    (event,) = third.events
    assert event.head is not None
    assert event.head.body == ids.b64u(b"two")
    journal.close()
    store.close()


class WriterToDelivery(RuleBasedStateMachine):
    """One subscribed queue: commands applied by the rules, their events fed to delivery; the
    subscriber acknowledges what it was pushed."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        root = Path(self.dir.name)
        self.journal = QueueJournal(JournalSettings(root=root / "j", max_queue_messages=3))
        self.store = StoreLog(StoreLogSettings(root=root / "s"))
        self.writer = QueueRules(self.journal, self.store)
        self.deliveries = Deliveries()
        self.now = NOW
        self.r: Recipient = _created(self.writer)
        self.pushed: list[str] = []
        """msg_ids pushed to the subscriber, in order."""
        self.acked: set[str] = set()
        self.expires: dict[str, int] = {}
        """msg_id → when it expires."""
        sub = self.writer.subscribe(
            self.r.queue, self.r.signed(auth.sub_text(self.r.queue, 1)), SUBSCRIBER, self.now
        )
        self._feed(sub)

    def _feed(self, outcome: QueueOutcome) -> None:
        for event in outcome.events:
            self._tell(event)

    def _tell(self, event: Event) -> None:
        if event.kind == "subscribed":
            assert event.subscriber is not None
            pushes = self.deliveries.subscribed(
                event.queue, event.lsn, event.head, event.subscriber, event.since
            )
        else:
            assert event.kind == "changed"
            pushes = self.deliveries.changed(event.queue, event.lsn, event.head)
        for push in pushes:
            assert (push.to, push.frame) == (SUBSCRIBER, Frame.MSG)
            assert push.head is not None
            self.pushed.append(push.head.msg_id)

    @rule(ttl_s=st.sampled_from([None, 1, 3]))
    def send(self, ttl_s: int | None) -> None:
        msg_id = ids.new_id()
        outcome = self.writer.send(self.r.sender, msg_id, b"m", ttl_s, self.now)
        assert outcome.status in (201, 429)
        self.expires[msg_id] = self.now + (ttl_s or 3600) * 1000
        self._feed(outcome)

    @rule()
    def ack_what_was_pushed(self) -> None:
        if not self.pushed or self.pushed[-1] in self.acked:
            return
        msg_id = self.pushed[-1]
        outcome = self.writer.ack(self.r.queue, msg_id, self.r.signed(), self.now)
        self.acked.add(msg_id)
        if outcome.status == 404:  # a sweep dropped it once expired: the ACK is refused
            assert self.expires.get(msg_id, self.now + 1) <= self.now, outcome
            return
        assert outcome.status in (200, 204), outcome
        self._feed(outcome)

    @rule(ms=st.sampled_from([500, 1500, 4000]), sweep=st.booleans())
    def time_passes(self, ms: int, sweep: bool) -> None:
        self.now += ms
        if sweep:
            for event in self.writer.expire(self.now):
                self._tell(event)

    @invariant()
    def the_subscriber_holds_the_head_once(self) -> None:
        assert len(self.pushed) == len(set(self.pushed))  # never the same message twice
        head = self.journal.peek(self.r.queue)  # expired or not: delivery was told of it
        if head is not None:
            assert self.pushed[-1:] == [ids.b64u(head.msg_id)]

    def teardown(self) -> None:
        self.journal.close()
        self.store.close()
        self.dir.cleanup()


WriterToDelivery.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
test_writer_events_keep_delivery_true = WriterToDelivery.TestCase
