"""SUB orders (issue 18): the queue-writer answers each accepted SUB with an order that grows
with every SUB it applies, whatever the clock says, and a resync carries the order it was
given; a refused SUB gets none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import auth, ids
from relay_queues.delivery import Subscriber
from relay_queues.writer import QueueRules
from relay_storelog.store import StoreLog, StoreLogSettings
from tests.queues.test_writer import NOW, Recipient, _created


@pytest.fixture
def rules(tmp_path: Path) -> Iterator[QueueRules]:
    journal = QueueJournal(JournalSettings(root=tmp_path / "journal", max_queue_messages=3))
    store = StoreLog(StoreLogSettings(root=tmp_path / "store"))
    yield QueueRules(journal, store)
    journal.close()
    store.close()


def test_accepted_subs_are_ordered_and_refused_ones_are_not(rules: QueueRules) -> None:
    r = _created(rules)
    signed = r.signed(auth.sub_text(r.queue, 1))
    orders = []
    for conn, now in [("a", NOW), ("b", NOW), ("c", NOW - 5000), ("d", NOW + 1)]:
        outcome = rules.subscribe(r.queue, signed, Subscriber(0, conn), now)
        assert outcome.status == 200
        assert outcome.data is not None
        (event,) = outcome.events
        assert event.since == outcome.data["since"]
        orders.append(outcome.data["since"])
    # The clock's microseconds, moved on past the last order (the clock went back for "c").
    assert orders == [NOW * 1000, NOW * 1000 + 1, NOW * 1000 + 2, (NOW + 1) * 1000]
    refused = rules.subscribe(r.queue, Recipient().signed(), Subscriber(0, "e"), NOW + 2)
    assert (refused.status, refused.code, refused.events) == (401, "AUTH", [])
    (resync,) = rules.resync(r.queue, Subscriber(0, "b"), NOW + 3, orders[1]).events
    assert (resync.kind, resync.subscriber, resync.since) == (
        "subscribed",
        Subscriber(0, "b"),
        orders[1],
    )
    assert rules.resync(ids.QueueId(ids.new_id()), Subscriber(0, "x"), NOW, 5).events == []
