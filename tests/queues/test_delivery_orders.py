"""Delivery's state machine with SUB orders (issue 18): the model of `test_delivery`, where every
SUB carries the queue-writer's order, plus what arrives out of that order after restarts: a
resync of the subscription in force (a queue-writer restarted), a resync or late event of an
older SUB, and the ingresses' `registered` notices."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from relay_queues.delivery import Deliveries, Frame, Head, Push, Subscriber, confirm_notice
from tests.queues.test_delivery import DeliveryMachine, Q


class OrderedDeliveryMachine(DeliveryMachine):
    def __init__(self) -> None:
        super().__init__()
        self.order = 0
        self.since: dict[Subscriber, int] = {}

    @rule(conn=st.sampled_from(["a", "b", "c"]), slot=st.integers(0, 1))
    def subscribe(self, conn: str, slot: int) -> None:
        old, self.subscriber = self.subscriber, Subscriber(slot, conn + str(self.n))
        self.n += 1
        self.order += 1
        self.since[self.subscriber] = self.order
        pushes = self.d.subscribed(Q, self.tick(), self.head(), self.subscriber, self.order)
        if old is not None:
            assert Push(old, Frame.END, Q) in pushes
        self.take(pushes)

    @precondition(lambda self: self.subscriber is not None)
    @rule()
    def the_subscription_in_force_is_resynced(self) -> None:
        """A queue-writer restarted: delivery asks for the head of every registered subscriber.
        A head it has already got does not come twice (`take` checks)."""
        assert self.subscriber is not None
        since = self.since[self.subscriber]
        pushes = self.d.subscribed(Q, self.tick(), self.head(), self.subscriber, since)
        assert all(p.frame is Frame.MSG for p in pushes)
        self.take(pushes)

    @precondition(lambda self: self.subscriber is not None and len(self.since) > 1)
    @rule(data=st.data())
    def an_older_sub_arrives_late(self, data: st.DataObject) -> None:
        """A resync or event of a SUB older than the one in force: it takes nothing over and
        gets END."""
        current = self.subscriber
        assert current is not None
        older = [s for s, n in self.since.items() if n < self.since[current]]
        if not older:
            return
        old = data.draw(st.sampled_from(older))
        pushes = self.d.subscribed(Q, self.tick(), self.head(), old, self.since[old])
        assert pushes == [Push(old, Frame.END, Q)]
        self.take(pushes)
        assert self.d.subscriber(Q) == current

    @precondition(lambda self: self.subscriber is not None)
    @rule(data=st.data())
    def a_registered_notice_arrives(self, data: st.DataObject) -> None:
        """An ingress recorded a SUB this instance saw: nothing to do, END for an older one."""
        current = self.subscriber
        assert current is not None
        who = data.draw(st.sampled_from(sorted(self.since, key=self.since.__getitem__)))
        pushes, resync = self.d.registered(Q, who, self.since[who])
        assert not resync
        if who == current:
            assert pushes == []
        else:
            assert pushes == [Push(who, Frame.END, Q)]
            self.take(pushes)


OrderedDeliveryMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
TestOrderedDelivery = OrderedDeliveryMachine.TestCase


def test_a_notice_of_a_sub_never_seen_asks_for_a_resync() -> None:
    """The instance took the partition over after the SUB's event and before its registry
    write: neither told it; the notice does, and the resync's answer takes the queue over."""
    d = Deliveries()
    a, b = Subscriber(0, "a"), Subscriber(1, "b")
    head = Head("m1", 1, "Ym9keQ")
    assert d.registered(Q, b, 20) == ([], True)  # knows nothing of the queue
    assert d.subscribed(Q, 1, head, a, 10) == [Push(a, Frame.MSG, Q, head)]  # a resync of a
    assert d.registered(Q, b, 20) == ([], True)  # b is newer than what it knows
    pushes = d.subscribed(Q, 2, head, b, 20)  # the resync b's notice asked for
    assert pushes == [Push(a, Frame.END, Q), Push(b, Frame.MSG, Q, head)]
    assert d.registered(Q, b, 20) == ([], False)
    assert d.registered(Q, a, 10) == ([Push(a, Frame.END, Q)], False)


def test_subs_without_orders_take_over_as_they_arrive() -> None:
    """Events of a queue-writer that gives no order (since 0) behave as before: the later
    event takes over, and the same subscriber told again is not pushed the head twice."""
    d = Deliveries()
    a, b = Subscriber(0, "a"), Subscriber(0, "b")
    head = Head("m1", 1, "Ym9keQ")
    assert d.subscribed(Q, 1, head, a) == [Push(a, Frame.MSG, Q, head)]
    assert d.subscribed(Q, 2, head, a) == []
    assert d.subscribed(Q, 3, head, b) == [Push(a, Frame.END, Q), Push(b, Frame.MSG, Q, head)]


def test_a_notice_never_seen_is_checked_against_the_registry() -> None:
    a, b = Subscriber(0, "a"), Subscriber(1, "b")
    assert confirm_notice(Q, a, 10, a, 10) == ([], 10)  # listed: resync it
    assert confirm_notice(Q, a, 10, a, 30) == ([], 30)  # listed with a later SUB of its own
    assert confirm_notice(Q, a, 10, b, 20) == ([Push(a, Frame.END, Q)], None)  # replaced
    assert confirm_notice(Q, a, 10, None, 0) == ([], None)  # left since
    # a left since, and an older SUB written late took the empty entry: nothing for a
    assert confirm_notice(Q, a, 30, b, 20) == ([], None)
