"""`relay_bus.routing`: the topic-to-partition rule, addressed stream strings, global shards;
and the durable-stream records round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_bus import routing, schemas, topics


def test_partition_of_topic_is_spread() -> None:
    seen = {routing.partition_of_topic(f"dev/{i}", 8) for i in range(200)}
    assert seen == set(range(8))
    assert routing.partition_of_topic("anything", 1) == 0


def test_partition_of_topic_known_values() -> None:
    """Pinned, so that a change of the rule (which would strand stored data) fails a test."""
    assert [routing.partition_of_topic(f"t/{i}", 8) for i in range(8)] == [4, 4, 5, 5, 0, 4, 5, 1]
    assert routing.partition_of_topic("a/b", 8) == 0


@given(st.integers(0, 4095), st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True))
def test_addresses_round_trip(partition: int, inner: str) -> None:
    assert routing.parse_address(routing.address(partition, inner), 4096) == (partition, inner)


@pytest.mark.parametrize(
    "bad", [None, 3, "", "x", "1", "1.", ".abc", "01.abc", "-1.abc", "8.abc", "1.a.b", "1.a=b"]
)
def test_bad_addresses_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the fault
        routing.parse_address(bad, 8)


def test_global_shards_never_collide_across_owners() -> None:
    assert routing.global_shard(0, 3) == 3
    assert routing.global_shard(1, 0) == routing.SHARD_SPAN
    ids = {routing.global_shard(p, s) for p in range(8) for s in range(routing.SHARD_SPAN)}
    assert len(ids) == 8 * routing.SHARD_SPAN


def test_ds_records_round_trip_and_travel_on_their_topics() -> None:
    request = schemas.DsRequest(
        id="r",
        origin="ingress-0",
        reply_slot=2,
        deadline_ms=1.0,
        op="store",
        db="messages",
        messages=(schemas.DsMessage(topic="a/b", payload="aGk", ts=5),),
    )
    reply = schemas.DsReply(
        id="r", origin="ingress-0", partition=3, instance="retainer-0", site="AB", status=201
    )
    assert schemas.decode(schemas.encode(request)) == request
    assert schemas.decode(schemas.encode(reply)) == reply
    assert isinstance(reply, schemas.Reply)
    schemas.check_topic(request, topics.PUBLICATIONS)
    schemas.check_topic(reply, topics.INGRESS_INBOX)
    with pytest.raises(ValueError, match="may not be sent"):
        schemas.check_topic(request, topics.QUEUE_COMMANDS)
