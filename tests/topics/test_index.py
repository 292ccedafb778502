"""The filter index against the reference matcher (`relay_topics.rules.matches`): a stateful
test through random add, remove, drop_slot, drop_partition and match sequences, a property test
over random filter sets, and the MQTT corner cases spelled out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from relay_topics.index import FilterIndex, Levels, Subscriber
from relay_topics.rules import matches, parse_filter, parse_topic

# A small alphabet so random filters and topics collide; `$`-levels and empty levels included.
LEVELS = ["a", "b", "", "$SYS", "$x"]
PARTITIONS = [0, 1, 2]
SUBSCRIBERS: list[Subscriber] = [(slot, f"c{conn}") for slot in (0, 1, 2) for conn in (0, 1)]
MAX_DEPTH = 6

levels = st.sampled_from(LEVELS)
topics = st.lists(levels, min_size=1, max_size=MAX_DEPTH).map(tuple)


@st.composite
def filters(draw: st.DrawFn) -> Levels:
    body = draw(st.lists(st.one_of(levels, st.just("+")), min_size=0, max_size=MAX_DEPTH))
    if not body or draw(st.booleans()):
        body.append("#")
    return tuple(body)


@st.composite
def topics_near(draw: st.DrawFn, topic_filter: Levels) -> Levels:
    """A topic made from a filter (wildcards filled in), so it usually matches it or nearly."""
    out: list[str] = []
    for level in topic_filter:
        if level == "+":
            out.append(draw(levels))
        elif level == "#":
            out.extend(draw(st.lists(levels, max_size=2)))
        else:
            out.append(level)
    if not out or draw(st.integers(0, 4)) == 0:
        out.append(draw(levels))
    return tuple(out)


subscriptions = st.tuples(st.sampled_from(PARTITIONS), filters(), st.sampled_from(SUBSCRIBERS))


def naive(
    entries: set[tuple[int, Levels, Subscriber]], partition: int, topic: Levels
) -> set[Subscriber]:
    return {s for p, f, s in entries if p == partition and matches(f, topic)}


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = FilterIndex()
        self.model: set[tuple[int, Levels, Subscriber]] = set()

    @initialize(entries=st.lists(subscriptions, max_size=20))
    def seed(self, entries: list[tuple[int, Levels, Subscriber]]) -> None:
        """Start most runs with a populated index, so probes have something to find."""
        for entry in entries:
            assert self.index.add(*entry) == (entry not in self.model)
            self.model.add(entry)

    @rule(
        partition=st.sampled_from(PARTITIONS),
        topic_filter=filters(),
        subscriber=st.sampled_from(SUBSCRIBERS),
    )
    def add(self, partition: int, topic_filter: Levels, subscriber: Subscriber) -> None:
        entry = (partition, topic_filter, subscriber)
        assert self.index.add(*entry) == (entry not in self.model)
        self.model.add(entry)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def add_again_elsewhere(self, data: st.DataObject) -> None:
        """The same (filter, subscriber) on another partition, or the very same entry again."""
        _, topic_filter, subscriber = data.draw(st.sampled_from(sorted(self.model)))
        entry = (data.draw(st.sampled_from(PARTITIONS)), topic_filter, subscriber)
        assert self.index.add(*entry) == (entry not in self.model)
        self.model.add(entry)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove_present(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(sorted(self.model)))
        assert self.index.remove(*entry)
        self.model.discard(entry)

    @rule(
        partition=st.sampled_from(PARTITIONS),
        topic_filter=filters(),
        subscriber=st.sampled_from(SUBSCRIBERS),
    )
    def remove_any(self, partition: int, topic_filter: Levels, subscriber: Subscriber) -> None:
        entry = (partition, topic_filter, subscriber)
        assert self.index.remove(*entry) == (entry in self.model)
        self.model.discard(entry)

    @rule(partition=st.sampled_from(PARTITIONS), slot=st.sampled_from([0, 1, 2, 3]))
    def drop_slot(self, partition: int, slot: int) -> None:
        gone = {e for e in self.model if e[0] == partition and e[2][0] == slot}
        assert self.index.drop_slot(partition, slot) == len(gone)
        self.model -= gone

    @rule(partition=st.sampled_from([*PARTITIONS, 9]))
    def drop_partition(self, partition: int) -> None:
        gone = {e for e in self.model if e[0] == partition}
        assert self.index.drop_partition(partition) == len(gone)
        self.model -= gone

    @precondition(lambda self: self.model)
    @rule(partition=st.sampled_from(PARTITIONS), topic=topics)
    def match(self, partition: int, topic: Levels) -> None:
        assert self.index.match(partition, topic) == naive(self.model, partition, topic)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def match_near_a_filter(self, data: st.DataObject) -> None:
        partition, topic_filter, _ = data.draw(st.sampled_from(sorted(self.model)))
        partition = data.draw(st.sampled_from([partition, *PARTITIONS]))
        topic = data.draw(topics_near(topic_filter))
        assert self.index.match(partition, topic) == naive(self.model, partition, topic)

    @invariant()
    def consistent(self) -> None:
        assert len(self.index) == len(self.model)
        nodes = self.index.check()
        if not self.model:
            assert nodes == 1  # pruned back to the root


TestIndexMachine = IndexMachine.TestCase


@given(
    entries=st.sets(subscriptions, max_size=40),
    probes=st.lists(st.tuples(st.sampled_from(PARTITIONS), topics), min_size=1, max_size=20),
)
def test_match_equals_the_reference_matcher(
    entries: set[tuple[int, Levels, Subscriber]], probes: list[tuple[int, Levels]]
) -> None:
    index = FilterIndex()
    for entry in entries:
        assert index.add(*entry)
    assert len(index) == len(entries)
    for partition, topic in probes:
        assert index.match(partition, topic) == naive(entries, partition, topic)
    for entry in entries:
        assert index.remove(*entry)
    assert len(index) == 0
    assert index.check() == 1


SUB: Subscriber = (0, "c")


def _matching(filter_text: str, topic_text: str) -> bool:
    index = FilterIndex()
    index.add(0, parse_filter(filter_text), SUB)
    found = index.match(0, parse_topic(topic_text)) == {SUB}
    assert found == matches(parse_filter(filter_text), parse_topic(topic_text))
    return found


@pytest.mark.parametrize(
    ("filter_text", "topic_text", "expected"),
    [
        # `#` matches the parent level, and every depth under it
        ("a/#", "a", True),
        ("a/#", "a/b", True),
        ("a/#", "a/b/c", True),
        ("a/#", "b", False),
        ("a/#", "ab", False),
        ("#", "a", True),
        ("#", "/", True),
        ("a/b/#", "a", False),
        # `+` is exactly one level, an empty one too
        ("a/+/c", "a//c", True),
        ("+/a", "/a", True),
        ("a/+", "a/", True),
        ("+", "/", False),
        ("+/+", "/", True),
        ("a/+", "a", False),
        ("a/+", "a/b/c", False),
        # empty levels are levels
        ("a//b", "a//b", True),
        ("a//b", "a/b", False),
        ("/a", "a", False),
        # `$` first levels are hidden from wildcard first levels only
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("+", "$SYS", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/#", "$SYS", True),
        ("$SYS/+", "$SYS/x", True),
        ("a/+", "a/$SYS", True),
        ("a/#", "a/$SYS", True),
        ("#", "x$/a", True),
    ],
)
def test_mqtt_cases(filter_text: str, topic_text: str, expected: bool) -> None:
    assert _matching(filter_text, topic_text) == expected


def test_overlapping_filters_give_a_subscriber_once() -> None:
    index = FilterIndex()
    other: Subscriber = (1, "d")
    for text in ["#", "a/#", "a/+", "a/b", "+/b", "+/+", "a/b/#"]:
        assert index.add(0, parse_filter(text), SUB)
    assert index.add(0, parse_filter("a/b"), other)
    assert not index.add(0, parse_filter("a/+"), SUB)
    assert len(index) == 8
    assert index.match(0, parse_topic("a/b")) == {SUB, other}
    assert index.match(0, parse_topic("a/c")) == {SUB}
    assert index.match(0, parse_topic("$SYS/b")) == set()


def test_partitions_are_independent() -> None:
    index = FilterIndex()
    f = parse_filter("a/+")
    assert index.add(0, f, SUB)
    assert index.add(1, f, SUB)
    assert len(index) == 2
    assert index.match(2, parse_topic("a/b")) == set()
    assert index.remove(0, f, SUB)
    assert not index.remove(0, f, SUB)
    assert index.match(0, parse_topic("a/b")) == set()
    assert index.match(1, parse_topic("a/b")) == {SUB}
    assert index.drop_partition(0) == 0
    assert index.drop_partition(1) == 1
    assert len(index) == 0
    assert index.check() == 1


def test_drop_slot_takes_that_slot_on_that_partition_only() -> None:
    index = FilterIndex()
    for text in ["a/#", "a/b", "+/b"]:
        index.add(0, parse_filter(text), (1, "x"))
        index.add(0, parse_filter(text), (1, "y"))
        index.add(0, parse_filter(text), (2, "x"))
        index.add(5, parse_filter(text), (1, "x"))
    assert index.drop_slot(0, 1) == 6
    assert index.drop_slot(0, 1) == 0
    assert len(index) == 6
    assert index.match(0, parse_topic("a/b")) == {(2, "x")}
    assert index.match(5, parse_topic("a/b")) == {(1, "x")}
    assert index.drop_slot(0, 2) == 3
    assert index.drop_slot(5, 1) == 3
    assert len(index) == 0
    assert index.check() == 1


def test_pruning_returns_the_trie_to_its_root() -> None:
    index = FilterIndex()
    assert index.add(0, parse_filter("a/b/c/d"), SUB)
    assert index.add(0, parse_filter("a/b"), SUB)
    assert index.add(0, parse_filter("a/+/#"), SUB)
    assert index.check() == 7  # root, a, b, c, d, +, #
    assert index.remove(0, parse_filter("a/b/c/d"), SUB)
    assert index.check() == 5  # c and d pruned, b kept for a/b
    assert not index.remove(0, parse_filter("a/b/c"), SUB)  # a prefix is not an entry
    assert not index.remove(0, parse_filter("x/y"), SUB)
    assert index.check() == 5
    assert index.remove(0, parse_filter("a/b"), SUB)
    assert index.remove(0, parse_filter("a/+/#"), SUB)
    assert index.check() == 1
    assert len(index) == 0


def test_a_filter_deeper_than_the_recursion_limit() -> None:
    deep = ("a",) * 5000
    index = FilterIndex()
    assert index.add(0, (*deep, "#"), SUB)
    assert index.add(0, ("+",) * 5000, (1, "d"))
    assert index.match(0, (*deep, "b")) == {SUB}
    assert index.match(0, deep) == {SUB, (1, "d")}
    assert index.drop_slot(0, 1) == 1
    assert index.drop_partition(0) == 1
    assert index.check() == 1


@pytest.mark.parametrize("bad", [(), ("#", "a"), ("a", "#", "#"), ("a", "b+")])
def test_a_malformed_filter_is_refused(bad: Levels) -> None:
    with pytest.raises(ValueError, match="level"):
        FilterIndex().add(0, bad, SUB)


def test_an_empty_topic_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one level"):
        FilterIndex().match(0, ())
