"""The order of retained pages, and pages of several owners merged into one (API.md, Retained).

Order: topics sort level by level, each level by its UTF-8 bytes (`a/b` < `a/b/c` < `a!`: every
topic under `a/b` is one contiguous run). `levels_key` gives that order as bytes compared
bytewise: the levels' UTF-8 joined by NUL, which no topic contains. The retained store keys its
records by it (`relay_streams.retained`), so a store's scans come in this order, and answers of
several stores merged by it come in the order one store holding everything would give.

Paging is keyset: a cursor is the last topic a page returned, and the next page holds what sorts
after it, so page N costs what page 1 costs. `merge_pages` makes one page of the owners' pages
that is safe to page on from; `skip` and `walk` page through every owner with any fetch
function (the ingress asks its retainers; tests ask lists).

Invariant: paging on from the last topic of each merged page visits every topic held
throughout exactly once, in this order, however the topics are spread over owners and however
few items each owner answers per ask.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from relay_topics import rules

T = TypeVar("T")

SEP = b"\x00"

Fetch = Callable[[str | None, int], Awaitable[tuple[list[T], bool]]]
"""`fetch(after, limit)`: up to `limit` items after topic `after` (None: from the first) in
`order_key` order, and whether more follow (a `merge_pages` result, for several owners)."""


def levels_key(levels: rules.Levels) -> bytes:
    """The levels' sort key: their UTF-8 joined by NUL. The retained store's keys (layout
    `retained/1`) are built on it: changing it changes what is on disk."""
    return SEP.join(level.encode() for level in levels)


def order_key(topic: str) -> bytes:
    """What orders topics in retained pages (and cursors); `TopicError` if invalid."""
    return levels_key(rules.parse_topic(topic))


def sorts_before(topic: str, other: str) -> bool:
    """Whether `topic` comes before `other` in retained pages (`other` is on a page that
    starts after the cursor `topic`); `TopicError` for either being invalid."""
    return order_key(topic) < order_key(other)


def merge_pages(
    pages: Sequence[tuple[Sequence[T], bool]], limit: int, topic_of: Callable[[T], str]
) -> tuple[list[T], bool]:
    """One page of at most `limit` items from the pages of several stores, in the order one
    store holding them all would give, and whether more follow. Each page is in `order_key`
    order and says whether its store has more after its last item; an item is taken only if
    no store that stopped early could still hold an earlier one, so paging on from the last
    item taken (keyset) visits every item once. Cost: O(total items * log stores)."""
    keyed = [[(order_key(topic_of(item)), item) for item in items] for items, _more in pages]
    bound = min(
        (page[-1][0] for page, (_items, more) in zip(keyed, pages, strict=True) if more and page),
        default=None,
    )
    more = any(more for _items, more in pages)
    taken: list[T] = []
    for key, item in heapq.merge(*keyed, key=lambda pair: pair[0]):
        if len(taken) == limit or (bound is not None and key > bound):
            return taken, True
        taken.append(item)
    return taken, more


async def walk(fetch: Fetch[T], limit: int, topic_of: Callable[[T], str]) -> AsyncIterator[list[T]]:
    """Every item, page by page (each non-empty, at most `limit`), in `order_key` order: one
    page in memory at a time. Stops at the first page that says nothing follows, or is empty."""
    after: str | None = None
    while True:
        page, more = await fetch(after, limit)
        if page:
            yield page
        if not more or not page:
            return
        after = topic_of(page[-1])


async def skip(fetch: Fetch[T], count: int, chunk: int, topic_of: Callable[[T], str]) -> str | None:
    """The topic `count` items in (the cursor of the page after them), fetched `chunk` at most
    at a time; None when there are fewer than `count` items (or `count` is 0)."""
    after: str | None = None
    while count > 0:
        page, more = await fetch(after, min(count, chunk))
        if not page:
            return None
        count -= len(page)
        after = topic_of(page[-1])
        if count > 0 and not more:
            return None
    return after
