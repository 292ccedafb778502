"""The order of retained pages and multi-owner paging (`relay_topics.pages`): the sort key pinned
byte for byte, and pages of topics spread over several owners, merged and walked with keyset
cursors, visiting every topic once in one owner's order. (That the retained store scans in this
order is `tests/streams/test_retained.py::test_order_key_is_the_stores_order`.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay_topics import pages
from relay_topics.pages import merge_pages, order_key
from relay_topics.rules import TopicError

# `$` first levels, empty levels, prefixes of each other ("a", "ab"), a byte above `/` and below
# letters ("!"), and one below every printable character ("a\x01").
LEVEL = st.sampled_from(["", "a", "ab", "b", "!", "$SYS", "$x", "é", "a\x01"])
TOPIC = st.lists(LEVEL, min_size=1, max_size=7).map("/".join).filter(bool)

Fetch = Callable[[str | None, int], Awaitable[tuple[list[str], bool]]]


def test_the_key_is_the_levels_joined_by_nul() -> None:
    """Pinned: the retained store's keys (layout `retained/1`) are built on it."""
    assert pages.levels_key(("a", "", "é")) == b"a\x00\x00\xc3\xa9"
    assert order_key("/a") == b"\x00a"
    assert order_key("$SYS/x") == b"$SYS\x00x"


def test_topics_sort_level_by_level() -> None:
    ordered = ["/", "a", "a/b", "a/b/c", "a/b!", "a\x01", "a!", "ab", "é"]
    assert sorted(reversed(ordered), key=order_key) == ordered
    # Plain string order would put `a!` before `a/b` ('!' < '/').
    assert sorted(["a/b", "a!"]) == ["a!", "a/b"]
    assert pages.sorts_before("a/b/c", "a!")
    assert not pages.sorts_before("a!", "a/b/c")
    assert not pages.sorts_before("a", "a")


@pytest.mark.parametrize("bad", ["", "a/+", "#", "a\x00b"])
def test_only_topics_have_a_key(bad: str) -> None:
    with pytest.raises(TopicError):
        order_key(bad)
    with pytest.raises(TopicError):
        pages.sorts_before(bad, "a")


def test_a_store_that_stopped_early_bounds_the_page() -> None:
    """Store 2 answered `b` and has more: nothing after `b` can be taken yet, though store 1
    sent `c` (store 2 may hold `b/x`, which sorts before `c`)."""
    page, more = merge_pages([(["a", "c"], False), (["b"], True)], 10, str)
    assert (page, more) == (["a", "b"], True)
    assert merge_pages([(["a", "c"], False), (["b"], False)], 10, str) == (["a", "b", "c"], False)
    assert merge_pages([(["a", "c"], False), (["b"], False)], 2, str) == (["a", "b"], True)
    assert merge_pages([([], False), ([], False)], 5, str) == ([], False)


def owners(spread: list[list[str]], answer: int, asked: list[tuple[int, bool]]) -> Fetch:
    """A fetch over several owners, each holding sorted topics and answering at most `answer`
    per ask (as a retainer stops at its reply size), merged as the ingress merges them; each
    ask's limit and whether its answer said more follow are appended to `asked`."""

    async def fetch(after: str | None, limit: int) -> tuple[list[str], bool]:
        answers = []
        for held in spread:
            later = [t for t in held if after is None or pages.sorts_before(after, t)]
            taken = later[: min(limit, answer)]
            answers.append((taken, len(later) > len(taken)))
        page, more = merge_pages(answers, limit, str)
        asked.append((limit, more))
        return page, more

    return fetch


def no_ask_after_the_end(asked: list[tuple[int, bool]]) -> bool:
    """Nothing was asked after an answer that said nothing follows."""
    return all(more for _limit, more in asked[:-1])


@st.composite
def spreads(draw: st.DrawFn) -> list[list[str]]:
    """Distinct topics spread over one to four owners, each owner's in `order_key` order."""
    stored = draw(st.lists(TOPIC, max_size=40, unique=True))
    count = draw(st.integers(1, 4))
    return [sorted(stored[i::count], key=order_key) for i in range(count)]


LIMIT = st.integers(1, 7)
ANSWER = st.integers(1, 9)
"""Items an owner answers per ask at most (a retainer stops at its reply size)."""


def everything(spread: list[list[str]]) -> list[str]:
    return sorted((t for held in spread for t in held), key=order_key)


@given(spreads(), LIMIT, ANSWER)
@settings(max_examples=80, deadline=None)
def test_merged_pages_visit_every_topic_once_in_order(
    spread: list[list[str]], limit: int, answer: int
) -> None:
    """Topics spread over several stores, each answering at most `answer` items per ask, paged
    by `merge_pages` with keyset cursors, come once each, in one store's order."""
    seen: list[str] = []
    cursor: bytes | None = None
    for _ in range(len(everything(spread)) + 2):
        answers = []
        for topics_here in spread:
            after = [t for t in topics_here if cursor is None or order_key(t) > cursor]
            answers.append((after[:answer], len(after) > answer))
        page, more = merge_pages(answers, limit, lambda t: t)
        assert len(page) <= limit
        seen += page
        if not more:
            break
        assert page, "more follow, but the page is empty"
        cursor = order_key(page[-1])
    assert seen == everything(spread)


@given(spreads(), LIMIT, ANSWER)
@settings(max_examples=60, deadline=None)
def test_walk_gives_every_topic_once_in_order(
    spread: list[list[str]], limit: int, answer: int
) -> None:
    asked: list[tuple[int, bool]] = []

    async def walked() -> list[list[str]]:
        return [page async for page in pages.walk(owners(spread, answer, asked), limit, str)]

    walked_pages = asyncio.run(walked())
    assert all(0 < len(page) <= limit for page in walked_pages)
    assert [t for page in walked_pages for t in page] == everything(spread)
    assert no_ask_after_the_end(asked)


@given(spreads(), st.integers(0, 45), LIMIT, ANSWER)
@settings(max_examples=60, deadline=None)
def test_skip_finds_the_topic_count_items_in(
    spread: list[list[str]], count: int, chunk: int, answer: int
) -> None:
    asked: list[tuple[int, bool]] = []
    found = asyncio.run(pages.skip(owners(spread, answer, asked), count, chunk, str))
    ordered = everything(spread)
    assert found == (ordered[count - 1] if 0 < count <= len(ordered) else None)
    assert all(1 <= limit <= chunk for limit, _more in asked)
    assert no_ask_after_the_end(asked)
