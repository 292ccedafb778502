"""Learned topic structure (LTS): a trie of topic levels that turns busy levels into `+` edges.

After EMQX's `emqx_ds_lts`. Every topic is a path from a root through one edge per level and a
final end edge to a leaf; the leaf's id is the topic's *static index*, and all topics that share
a leaf form one stream. When a topic is learned, at each level the walk follows, in order:
the concrete edge for that level if it exists, else the `+` edge if it exists, else it adds a
concrete edge while the node has fewer than `threshold(depth)` concrete children, else it adds
the node's `+` edge. The levels that went through `+` edges are the topic's *varying* levels.

Invariants:
- a learned topic always resolves to the same leaf: a node gets a `+` edge only once it has
  `threshold` concrete children, and after that never gets another concrete edge, so no later
  topic can change the path an earlier one took;
- topics whose first level starts with `$` live under their own root (`DOLLAR_ROOT`), so a
  wildcard at the first level (of a filter, or a learned `+` edge) never reaches them;
- node ids are unique within a trie: new nodes get ids above every id it holds;
- pure data: no I/O. The layout persists the edges that `learn` reports as new.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NewType

from relay_topics.rules import Levels

NodeId = NewType("NodeId", int)
"""A trie node; a leaf's id is a stream's static index."""

ROOT = NodeId(0)
DOLLAR_ROOT = NodeId(1)
PLUS = "+"
"""Label of a wildcard edge (a topic level can never be `+`)."""
END = "\x00"
"""Label of the edge from a topic's last level to its leaf (a level can never contain NUL)."""


class TrieError(ValueError):
    """Persisted edges that cannot form a trie (two children for one edge, unknown parent)."""


@dataclass(frozen=True)
class Edge:
    parent: NodeId
    label: str
    child: NodeId


@dataclass(frozen=True)
class Leaf:
    """A stream: its static index and the labels on its path (`+` for varying levels)."""

    static: NodeId
    path: Levels
    dollar: bool
    """Under the `$` root: every topic of the stream starts with `$`."""

    def covered_by(self, topic_filter: Levels) -> bool:
        """True when every topic of this stream matches the filter, so a read needs no
        per-message check. False does not mean that none matches."""
        if self.dollar and topic_filter[0] in ("+", "#"):
            return False
        for i, label in enumerate(self.path):
            if i >= len(topic_filter):
                return False
            wanted = topic_filter[i]
            if wanted == "#":
                return True
            if wanted != "+" and (label == PLUS or label != wanted):
                return False
        rest = topic_filter[len(self.path) :]
        return rest in ((), ("#",))


class Trie:
    def __init__(self, thresholds: tuple[int, ...]) -> None:
        if not thresholds or any(t < 1 for t in thresholds):
            raise ValueError(f"LTS thresholds must be positive, got {thresholds!r}")
        self.thresholds = thresholds
        self._children: dict[NodeId, dict[str, NodeId]] = {ROOT: {}, DOLLAR_ROOT: {}}
        self._concrete: dict[NodeId, int] = {}
        self._leaves: dict[NodeId, Levels] = {}
        self._paths: dict[NodeId, Levels] = {ROOT: (), DOLLAR_ROOT: ()}
        self._root: dict[NodeId, NodeId] = {ROOT: ROOT, DOLLAR_ROOT: DOLLAR_ROOT}
        self._next = NodeId(2)

    # -- building ------------------------------------------------------------------------

    def threshold(self, depth: int) -> int:
        """Concrete children a node at `depth` (0 = a root) may have before it gets a `+` edge."""
        return self.thresholds[min(depth, len(self.thresholds) - 1)]

    def load(self, edges: Iterable[Edge]) -> None:
        """Add persisted edges (in any order). Raises `TrieError` if they contradict each other."""
        pending = list(edges)
        while pending:
            left = []
            for edge in pending:
                if edge.parent in self._paths:
                    self._add(edge)
                else:
                    left.append(edge)
            if len(left) == len(pending):
                raise TrieError(
                    f"{len(left)} trie edges hang from unknown nodes "
                    f"(first: parent {left[0].parent}, label {left[0].label!r})"
                )
            pending = left

    def _add(self, edge: Edge) -> None:
        children = self._children[edge.parent]
        if edge.label in children:
            if children[edge.label] != edge.child:
                raise TrieError(f"node {edge.parent} has two children for {edge.label!r}")
            return
        if edge.child in self._paths or edge.child in (ROOT, DOLLAR_ROOT):
            raise TrieError(f"node {edge.child} is reached by two edges")
        parent_path = self._paths[edge.parent]
        children[edge.label] = edge.child
        self._root[edge.child] = self._root[edge.parent]
        if edge.label == END:
            self._leaves[edge.child] = parent_path
            self._paths[edge.child] = parent_path
        else:
            if edge.label != PLUS:
                self._concrete[edge.parent] = self._concrete.get(edge.parent, 0) + 1
            self._children[edge.child] = {}
            self._paths[edge.child] = (*parent_path, edge.label)
        self._next = NodeId(max(self._next, edge.child + 1))

    def _new(self, parent: NodeId, label: str, added: list[Edge]) -> NodeId:
        edge = Edge(parent, label, self._next)
        self._add(edge)
        added.append(edge)
        return edge.child

    def learn(self, topic: Levels) -> tuple[NodeId, list[Edge]]:
        """The topic's static index, adding edges as the module docstring says; returns them."""
        node = DOLLAR_ROOT if topic[0].startswith("$") else ROOT
        added: list[Edge] = []
        for depth, level in enumerate(topic):
            children = self._children[node]
            child = children.get(level)
            if child is None:
                child = children.get(PLUS)
            if child is None:
                if self._concrete.get(node, 0) < self.threshold(depth):
                    child = self._new(node, level, added)
                else:
                    child = self._new(node, PLUS, added)
            node = child
        leaf = self._children[node].get(END)
        if leaf is None:
            leaf = self._new(node, END, added)
        return leaf, added

    def lookup(self, topic: Levels) -> NodeId | None:
        """The static index `learn` gave this topic, or None if it was never learned."""
        node = DOLLAR_ROOT if topic[0].startswith("$") else ROOT
        for level in topic:
            children = self._children[node]
            child = children.get(level)
            if child is None:
                child = children.get(PLUS)
            if child is None:
                return None
            node = child
        return self._children[node].get(END)

    # -- reading -------------------------------------------------------------------------

    def match(self, topic_filter: Levels) -> list[Leaf]:
        """Every leaf that may hold a topic matching the filter (`$` rule included)."""
        first = topic_filter[0]
        root = DOLLAR_ROOT if first.startswith("$") else ROOT  # a wildcard is never `$`
        found: list[NodeId] = []
        self._match(root, topic_filter, 0, found)
        return [self._leaf(static) for static in sorted(found)]

    def _match(self, node: NodeId, topic_filter: Levels, depth: int, found: list[NodeId]) -> None:
        children = self._children[node]
        if depth == len(topic_filter):
            leaf = children.get(END)
            if leaf is not None:
                found.append(leaf)
            return
        wanted = topic_filter[depth]
        if wanted == "#":
            found.extend(self._leaves_under(node))
        elif wanted == "+":
            for label, child in children.items():
                if label != END:
                    self._match(child, topic_filter, depth + 1, found)
        else:
            for label in (wanted, PLUS):
                nxt = children.get(label)
                if nxt is not None:
                    self._match(nxt, topic_filter, depth + 1, found)

    def _leaves_under(self, node: NodeId) -> Iterator[NodeId]:
        stack = [node]
        while stack:
            for label, child in self._children[stack.pop()].items():
                if label == END:
                    yield child
                else:
                    stack.append(child)

    def _leaf(self, static: NodeId) -> Leaf:
        return Leaf(static, self._leaves[static], self._root[static] == DOLLAR_ROOT)

    def leaf(self, static: int) -> Leaf | None:
        """The leaf with this static index, or None if there is none."""
        if NodeId(static) not in self._leaves:
            return None
        return self._leaf(NodeId(static))

    def leaves(self) -> list[Leaf]:
        return [self._leaf(static) for static in sorted(self._leaves)]

    def edges(self) -> list[Edge]:
        return [
            Edge(parent, label, child)
            for parent, children in self._children.items()
            for label, child in children.items()
        ]

    def learned_paths(self) -> list[Edge]:
        """The edges of every root-to-leaf path that has a `+` edge (what a new generation
        inherits: the learned structure without the concrete topics seen before it)."""
        keep: dict[tuple[NodeId, str], Edge] = {}
        for static, path in self._leaves.items():
            if PLUS not in path:
                continue
            node = self._root[static]
            for label in (*path, END):
                child = self._children[node][label]
                keep[(node, label)] = Edge(node, label, child)
                node = child
            assert node == static
        return list(keep.values())

    def __len__(self) -> int:
        """Number of leaves (streams)."""
        return len(self._leaves)
