"""Hypothesis strategies for replicated values: states reached by real operations on replicas
(adds, removes, writes, merges between replicas), not arbitrary structures, so that every state
is one a replicator could hold."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from relay_kv.clock import Version
from relay_kv.crdt import AWSet, KvMap, Register, Value, merge

SITES = ("A" * 16, "B" * 16, "C" * 16)
MEMBERS = (b"x", b"y", b"z", b"w")

versions = st.builds(Version, st.integers(1, 50), st.integers(0, 3), st.sampled_from(SITES))
registers = st.builds(
    Register,
    versions,
    st.one_of(st.none(), st.binary(max_size=3)),
    st.one_of(st.none(), st.integers(1, 60)),
)
maps = st.builds(KvMap, st.dictionaries(st.sampled_from(("f", "g", "h")), registers, max_size=3))


@dataclass
class SetHistory:
    """Replicas of one set, the operations applied and what a correct set must show."""

    replicas: list[AWSet]
    adds: list[tuple[bytes, tuple[str, int]]] = field(default_factory=list)
    """Every add: (member, the dot it created)."""
    removed: set[tuple[bytes, tuple[str, int]]] = field(default_factory=set)
    """Every (member, dot) a remove observed (and so removed), or a later add of the member at
    a replica that had observed it superseded."""

    def expected(self) -> set[bytes]:
        """ORSWOT's meaning: a member is in the set iff one of its adds was not observed by any
        remove."""
        return {member for member, dot in self.adds if (member, dot) not in self.removed}


@st.composite
def set_histories(draw: st.DrawFn, max_ops: int = 25) -> SetHistory:
    """Three replicas (one per site); each op runs at one replica: add, remove or receive
    another replica's state."""
    history = SetHistory([AWSet() for _ in SITES])
    wall = 0
    for _ in range(draw(st.integers(0, max_ops))):
        at = draw(st.integers(0, len(SITES) - 1))
        state = history.replicas[at]
        op = draw(st.sampled_from(("add", "remove", "merge")))
        wall += draw(st.integers(0, 2))
        version = Version(wall, draw(st.integers(0, 5)), SITES[at])
        if op == "add":
            members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=2, unique=True))
            for member in members:  # an add supersedes the adds of the member it observed
                history.removed.update((member, d) for d in state.entries.get(member, {}))
            state = state.add(members, version)
            dot = next(iter(state.entries[members[0]]))
            history.adds.extend((m, dot) for m in members)
        elif op == "remove":
            members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=2, unique=True))
            for member in members:
                history.removed.update((member, d) for d in state.entries.get(member, {}))
            state = state.remove(members, version)
        else:
            other = history.replicas[draw(st.integers(0, len(SITES) - 1))]
            state = state.merge(other)
        history.replicas[at] = state
    return history


sets = set_histories().flatmap(lambda h: st.sampled_from(h.replicas))
values: st.SearchStrategy[Value] = st.one_of(registers, maps, sets)


def merge_all(states: list[AWSet]) -> AWSet:
    out = AWSet()
    for state in states:
        result = merge(out, state)
        assert isinstance(result, AWSet)
        out = result
    return out
