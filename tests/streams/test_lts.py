"""The learned topic structure: thresholds, `+` edges, the `$` root, inheritance, matching."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_streams import lts
from relay_streams.lts import PLUS, Trie
from relay_topics import rules


def paths(trie: Trie) -> set[str]:
    return {"/".join(leaf.path) for leaf in trie.leaves()}


def test_a_level_becomes_a_wildcard_edge_past_its_threshold() -> None:
    trie = Trie((100, 20))
    for i in range(101):
        trie.learn(("dev", f"d{i}"))
    # Level 1 of `dev` holds 20 concrete children; the 21st and later go through `+`.
    assert len(trie) == 21
    assert "dev/+" in paths(trie)
    assert trie.lookup(("dev", "d5")) != trie.lookup(("dev", "d50"))
    assert trie.lookup(("dev", "d50")) == trie.lookup(("dev", "d99"))
    # A level seen before the wildcard stays concrete for good.
    static, added = trie.learn(("dev", "d5"))
    assert static == trie.lookup(("dev", "d5"))
    assert added == []
    # The first level allows 100 concrete children (EMQX's default; `dev` is one), then `+`.
    for i in range(99):
        trie.learn((f"t{i}",))
    assert "+" not in paths(trie)
    trie.learn(("t99",))
    assert "+" in paths(trie)


def test_dollar_topics_live_under_their_own_root() -> None:
    trie = Trie((1,))
    trie.learn(("a", "x"))
    trie.learn(("b", "x"))  # the root's second child: `+`
    dollar, _ = trie.learn(("$SYS", "x"))
    assert trie.lookup(("$SYS", "x")) == dollar
    assert dollar not in {leaf.static for leaf in trie.match(("#",))}
    assert dollar not in {leaf.static for leaf in trie.match(("+", "x"))}
    assert [leaf.static for leaf in trie.match(("$SYS", "#"))] == [dollar]
    assert [leaf.static for leaf in trie.match(("$SYS", "+"))] == [dollar]
    # `$` first levels past the threshold share a `+` edge under the `$` root only.
    other, _ = trie.learn(("$other", "x"))
    assert trie.leaf(other) == lts.Leaf(other, (PLUS, "x"), True)
    assert other not in {leaf.static for leaf in trie.match(("+", "x"))}
    assert other in {leaf.static for leaf in trie.match(("$other", "x"))}
    assert not trie.leaf(other).covered_by(("$other", "x"))  # type: ignore[union-attr]


def test_topic_and_parent_are_different_streams() -> None:
    trie = Trie((10,))
    a, _ = trie.learn(("a",))
    ab, _ = trie.learn(("a", "b"))
    assert a != ab
    assert {leaf.static for leaf in trie.match(("a", "#"))} == {a, ab}
    assert [leaf.static for leaf in trie.match(("a",))] == [a]


def test_learned_paths_are_inherited_without_concrete_topics() -> None:
    old = Trie((2, 1))
    for topic in ["a/1", "a/2", "a/3", "b/1", "c/1", "d/1"]:
        old.learn(tuple(topic.split("/")))
    assert paths(old) == {"a/1", "a/+", "b/1", "+/1"}
    new = Trie((2, 1))
    new.load(old.learned_paths())
    assert paths(new) == {"a/+", "+/1"}
    # Ids of inherited nodes are kept, so a stream's static index is the same.
    assert new.lookup(("a", "9")) == old.lookup(("a", "9"))
    # a/1 now goes through the learned `+`; b (the root's first concrete child here) is new.
    assert new.learn(("a", "1"))[0] == old.lookup(("a", "3"))


def test_load_accepts_edges_in_any_order_and_refuses_contradictions() -> None:
    trie = Trie((3, 2))
    rng = random.Random(7)
    for _ in range(200):
        trie.learn(tuple(rng.choice("abcde") for _ in range(rng.randint(1, 4))))
    edges = trie.edges()
    rng.shuffle(edges)
    copy = Trie((3, 2))
    copy.load(edges)
    assert copy.leaves() == trie.leaves()
    bad = Trie((3, 2))
    with pytest.raises(lts.TrieError, match="two children"):
        bad.load([*edges, lts.Edge(edges[0].parent, edges[0].label, lts.NodeId(10**6))])
    with pytest.raises(lts.TrieError, match="unknown nodes"):
        Trie((3,)).load([lts.Edge(lts.NodeId(77), "x", lts.NodeId(78))])


def test_thresholds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Trie((0,))


level = st.sampled_from(["a", "b", "c", "", "$d"])
topic_st = st.lists(level, min_size=1, max_size=4).map(tuple)
filter_st = st.lists(st.one_of(level, st.just("+")), min_size=1, max_size=4).flatmap(
    lambda ls: st.sampled_from([tuple(ls), (*ls, "#")])
)


@given(
    learned=st.lists(topic_st, max_size=40),
    thresholds=st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple),
    topic_filter=filter_st,
)
def test_match_finds_every_matching_topic_and_covered_streams_hold_only_matches(
    learned: list[tuple[str, ...]], thresholds: tuple[int, ...], topic_filter: tuple[str, ...]
) -> None:
    trie = Trie(thresholds)
    leaf_of = {topic: trie.learn(topic)[0] for topic in learned}
    assert all(trie.lookup(topic) == static for topic, static in leaf_of.items())
    found = {leaf.static: leaf for leaf in trie.match(topic_filter)}
    for topic, static in leaf_of.items():
        if rules.matches(topic_filter, topic):
            assert static in found
        elif static in found:
            assert not found[static].covered_by(topic_filter)
