"""Which WebSocket subscribers' MQTT topic filters match a live publication, per Kafka partition.

Delivery adds a (filter, subscriber) on the partition its subscription came in on, and routes each
publication read from partition p to `match(p, topic levels)`. Filters and topics arrive as levels
(`relay_topics.rules`: parsed by the ingress, split again by `rules.levels`).

Matching rules are `relay_topics.rules` (the tests compare `match` against `rules.matches`); the
trie applies them level by level instead of filter by filter:
- `+` matches exactly one level, an empty one too; `#`, only as the last level, matches the rest of
  the topic including no level at all (`a/#` matches `a`, `a/b`, `a/b/c`);
- a filter whose first level is `+` or `#` does not match a topic whose first level starts with
  `$` (`rules.hidden_from_wildcards`); empty levels are real levels (`a//b` has three, `/a` two).

Layout: one trie of filter levels shared by all partitions. A node has a child per literal level,
plus at most one `+` child and one `#` child (kept apart from the literals, so a topic level can
never be taken for a wildcard); each node holds `{partition: set of subscribers}` for the filters
ending at it.

Invariants:
- every node except the root holds at least one subscriber or has at least one child: removing
  or dropping prunes the emptied path, so memory returns and an empty index is the root alone;
- no node holds an empty subscriber set for a partition (the partition key goes with its last one);
- `len(self)` equals the number of (partition, filter, subscriber) entries in the trie, and the
  per-partition counts add up to it; `check()` verifies all of this (for tests and post-mortems).

Nothing here is durable: delivery rebuilds the index from Redis when it takes a partition over.
"""

from __future__ import annotations

from collections.abc import Callable

from relay_topics import rules
from relay_topics.rules import Levels

Subscriber = tuple[int, str]
"""(ingress inbox slot, connection id)."""

_PLUS = rules.PLUS
_HASH = rules.HASH


class _Node:
    __slots__ = ("children", "hash", "plus", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.subscribers: dict[int, set[Subscriber]] = {}

    def is_empty(self) -> bool:
        return not (self.subscribers or self.children or self.plus or self.hash)

    def child(self, level: str) -> _Node | None:
        if level == _PLUS:
            return self.plus
        if level == _HASH:
            return self.hash
        return self.children.get(level)

    def make_child(self, level: str) -> _Node:
        found = self.child(level)
        if found is not None:
            return found
        node = _Node()
        if level == _PLUS:
            self.plus = node
        elif level == _HASH:
            self.hash = node
        else:
            self.children[level] = node
        return node

    def drop_child(self, level: str) -> None:
        if level == _PLUS:
            self.plus = None
        elif level == _HASH:
            self.hash = None
        else:
            del self.children[level]

    def edges(self) -> list[tuple[str, _Node]]:
        out = list(self.children.items())
        if self.plus is not None:
            out.append((_PLUS, self.plus))
        if self.hash is not None:
            out.append((_HASH, self.hash))
        return out


class FilterIndex:
    """Subscriptions (filter, subscriber) per Kafka partition, in one trie of filter levels."""

    def __init__(self) -> None:
        self._root = _Node()
        self._counts: dict[int, int] = {}
        self._total = 0

    def __len__(self) -> int:
        """Number of (partition, filter, subscriber) entries. O(1)."""
        return self._total

    def add(self, partition: int, filter_levels: Levels, subscriber: Subscriber) -> bool:
        """Add the subscription on that partition; True if it was not there yet.

        O(depth of the filter). Raises `rules.TopicError` (a `ValueError`) for levels that are
        not a filter (`rules.check_filter_levels`).
        """
        rules.check_filter_levels(filter_levels)
        node = self._root
        for level in filter_levels:
            node = node.make_child(level)
        subscribers = node.subscribers.setdefault(partition, set())
        if subscriber in subscribers:
            return False
        subscribers.add(subscriber)
        self._counts[partition] = self._counts.get(partition, 0) + 1
        self._total += 1
        return True

    def remove(self, partition: int, filter_levels: Levels, subscriber: Subscriber) -> bool:
        """Remove the subscription from that partition only; True if it was there.

        O(depth of the filter), pruning included.
        """
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in filter_levels:
            child = node.child(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        subscribers = node.subscribers.get(partition)
        if subscribers is None or subscriber not in subscribers:
            return False
        subscribers.discard(subscriber)
        if not subscribers:
            del node.subscribers[partition]
        self._uncount(partition, 1)
        # Prune from the end of the filter up while the nodes are left empty.
        for parent, level in reversed(path):
            if not node.is_empty():
                break
            parent.drop_child(level)
            node = parent
        return True

    def drop_slot(self, partition: int, slot: int) -> int:
        """Remove every subscription of that inbox slot on that partition; how many there were.

        Walks the whole trie: O(nodes + entries on that partition). An ingress slot going away
        is rare next to publications, so no per-slot index is kept to make this cheaper.
        """
        if partition not in self._counts:
            return 0
        removed = 0

        def forget(node: _Node) -> None:
            nonlocal removed
            subscribers = node.subscribers.get(partition)
            if subscribers is None:
                return
            gone = {s for s in subscribers if s[0] == slot}
            if gone:
                subscribers -= gone
                removed += len(gone)
                if not subscribers:
                    del node.subscribers[partition]

        self._sweep(forget)
        self._uncount(partition, removed)
        return removed

    def drop_partition(self, partition: int) -> int:
        """Forget every subscription on that partition (revoked); how many there were.

        Walks the whole trie: O(nodes).
        """
        if partition not in self._counts:
            return 0

        def forget(node: _Node) -> None:
            node.subscribers.pop(partition, None)

        self._sweep(forget)
        removed = self._counts[partition]
        self._uncount(partition, removed)
        return removed

    def match(self, partition: int, topic_levels: Levels) -> set[Subscriber]:
        """The subscribers on that partition with at least one filter matching the topic, each once.

        O(trie nodes visited + subscribers collected): at each topic level only the literal child
        for that level, the `+` child and the `#` child are followed, so the cost grows with the
        topic's depth and the wildcard branching that exists, not with the number of filters.
        Nodes of filters held for other partitions on those paths are visited too (one trie).
        The topic is parsed levels (at least one), as `parse_topic` returns.
        """
        if not topic_levels:
            raise ValueError("a topic has at least one level")
        found: set[Subscriber] = set()
        depth = len(topic_levels)
        dollar = rules.hidden_from_wildcards(topic_levels)
        # An explicit stack, not recursion: a valid topic can have tens of thousands of levels.
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            wild = not (i == 0 and dollar)  # MQTT 4.7.2: no `+`/`#` first level for `$` topics
            if wild and node.hash is not None:
                found.update(node.hash.subscribers.get(partition, ()))
            if i == depth:
                found.update(node.subscribers.get(partition, ()))
                continue
            child = node.children.get(topic_levels[i])
            if child is not None:
                stack.append((child, i + 1))
            if wild and node.plus is not None:
                stack.append((node.plus, i + 1))
        return found

    def check(self) -> int:
        """Verify the module's invariants; the number of trie nodes, root included.

        Raises `AssertionError` naming the first broken one. O(nodes + entries); for tests and
        post-mortems, not for the delivery path.
        """
        counts: dict[int, int] = {}
        nodes = 0
        stack: list[tuple[_Node, bool]] = [(self._root, True)]
        while stack:
            node, is_root = stack.pop()
            nodes += 1
            if not is_root and node.is_empty():
                raise AssertionError("an empty node was not pruned")
            if node.hash is not None and (node.hash.children or node.hash.plus or node.hash.hash):
                raise AssertionError("a '#' node has children")
            for partition, subscribers in node.subscribers.items():
                if not subscribers:
                    raise AssertionError(f"an empty subscriber set for partition {partition}")
                counts[partition] = counts.get(partition, 0) + len(subscribers)
            stack.extend((child, False) for _, child in node.edges())
        if counts != self._counts:
            raise AssertionError(f"per-partition counts {self._counts} != entries {counts}")
        if sum(counts.values()) != self._total:
            raise AssertionError(f"len {self._total} != entries {sum(counts.values())}")
        return nodes

    def _uncount(self, partition: int, removed: int) -> None:
        if not removed:
            return
        self._total -= removed
        left = self._counts[partition] - removed
        if left:
            self._counts[partition] = left
        else:
            del self._counts[partition]

    def _sweep(self, visit: Callable[[_Node], None]) -> None:
        """Call `visit` on every node, children before parents, pruning those left empty.

        Iterative post-order (a filter may be deeper than Python's recursion limit).
        """
        stack: list[tuple[_Node, _Node | None, str, bool]] = [(self._root, None, "", False)]
        while stack:
            node, parent, level, expanded = stack.pop()
            if not expanded:
                stack.append((node, parent, level, True))
                stack.extend((child, node, lvl, False) for lvl, child in node.edges())
                continue
            visit(node)
            if parent is not None and node.is_empty():
                parent.drop_child(level)
