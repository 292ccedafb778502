"""A durable-stream write split by owner (`relay_ds.batches.split`): hypothesis checks that
every accepted message lands in its owner's part in batch order and that a batch is refused
exactly when it breaks a limit; examples pin which problem is reported first."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_ds.batches import BatchLimits, split
from relay_ds.errors import Refused, TooLarge
from relay_durable import codec


@dataclass(frozen=True)
class Msg:
    topic: str
    payload: str
    n: int = 0
    """Which message of the batch it is (messages may otherwise be equal)."""


def owner_of(partitions: int) -> Callable[[str], int]:
    return lambda topic: zlib.crc32(topic.encode()) % partitions


TOPIC = (
    st.lists(st.sampled_from(["a", "b", "sensor", "é", ""]), min_size=1, max_size=4)
    .map("/".join)
    .filter(bool)
)
LIMITS = st.builds(
    BatchLimits,
    messages=st.integers(1, 12),
    bytes=st.integers(1, 200),
    payload_bytes=st.integers(0, 40),
)


@given(
    st.lists(st.tuples(TOPIC, st.binary(max_size=50)), min_size=1, max_size=15),
    LIMITS,
    st.integers(1, 8),
)
def test_accepted_batches_are_split_by_owner_in_order(
    drawn: list[tuple[str, bytes]], limits: BatchLimits, partitions: int
) -> None:
    batch = [Msg(topic, codec.b64u(payload), i) for i, (topic, payload) in enumerate(drawn)]
    owner = owner_of(partitions)
    over = (
        len(batch) > limits.messages
        or any(len(p) > limits.payload_bytes for _, p in drawn)
        or sum(len(p) + len(t.encode()) for t, p in drawn) > limits.bytes
    )
    if over:
        with pytest.raises(TooLarge):
            split(batch, limits, owner)
        return
    parts = split(batch, limits, owner)
    assert list(parts) == sorted(parts)
    assert all(parts.values())
    for partition, part in parts.items():
        assert all(owner(m.topic) == partition for m in part)
        assert [m.n for m in part] == sorted(m.n for m in part)  # the batch's order
    assert sorted(m.n for part in parts.values() for m in part) == list(range(len(batch)))
    for part in parts.values():  # the messages themselves, not copies
        assert all(m is batch[m.n] for m in part)


LOOSE = BatchLimits(messages=10, bytes=1000, payload_bytes=10)


def test_the_first_problem_is_reported() -> None:
    ok = Msg("a/b", "aGk")
    with pytest.raises(Refused, match=r"^a batch needs at least one message$"):
        split([], LOOSE, owner_of(2))
    with pytest.raises(TooLarge, match=r"^over 10 messages in one batch$"):
        split([ok] * 11, LOOSE, owner_of(2))
    with pytest.raises(Refused, match=r"^1.topic: topic is empty$"):
        split([ok, Msg("", "!!"), Msg("a", "a")], LOOSE, owner_of(2))
    with pytest.raises(Refused, match=r"^1.payload: not base64url$"):
        split([ok, Msg("a", "a"), Msg("+", "aGk")], LOOSE, owner_of(2))
    with pytest.raises(TooLarge, match=r"^1.payload: over 10 bytes$"):
        split([ok, Msg("a", codec.b64u(b"x" * 11)), Msg("+", "!")], LOOSE, owner_of(2))
    with pytest.raises(TooLarge, match=r"^batch over 20 bytes of topics and payloads$"):
        split([Msg("abcdef", codec.b64u(b"x" * 7))] * 2, BatchLimits(10, 20, 10), owner_of(2))
    assert split([Msg("abcdef", codec.b64u(b"x" * 4))] * 2, BatchLimits(10, 20, 10), owner_of(1))


def test_a_topic_is_checked_by_the_topic_rules() -> None:
    with pytest.raises(Refused, match=r"^0.topic: topic contains NUL$"):
        split([Msg("a\x00", "aGk")], LOOSE, owner_of(2))
    with pytest.raises(Refused, match=r"^0.topic: .*wildcard"):
        split([Msg("a/+", "aGk")], LOOSE, owner_of(2))
