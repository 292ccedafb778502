"""Where durable-stream requests go: the partition of `relay.publications` that owns a topic,
and the partition-addressed strings clients hold for streams and iterators.

The retainer instance k of n owns the partitions p with p mod n == k (`relay_runtime.ownership`)
and hosts one stream store for all of them. A topic's messages live with the owner of
`partition_of_topic(topic)`, so a write goes to one partition and a read of one stream goes to
the partition named in its string; a read that spans owners (`get_streams`) goes to every
partition and is merged in rank order (BRIEF §3).

Invariants:
- `partition_of_topic` is a pure function of the topic's UTF-8 bytes and the partition count
  (blake2b, not Python's salted `hash`), so every process and every restart agrees;
- an addressed string is `<partition>.<inner>` where `inner` is the stream store's own opaque
  base64url string (which never contains `.`); `parse_address` returns exactly what `address`
  was given or raises `ValueError`;
- a shard's global number is `partition * SHARD_SPAN + shard`, where `partition` is the lowest
  partition its owner holds: shard ids and rank X never collide across owners, and with one
  retainer they equal the store's own shard numbers.
"""

from __future__ import annotations

import hashlib
import re

SHARD_SPAN = 1024
"""Shards one owner may have per database (the stream store's `MAX_SHARDS`)."""

ADDRESS_PATTERN = r"^(0|[1-9][0-9]{0,3})\.([A-Za-z0-9_-]+)$"
"""An addressed stream or iterator string (for API schemas)."""
_ADDRESSED = re.compile(ADDRESS_PATTERN)


def partition_of_topic(topic: str, partitions: int) -> int:
    """The partition of `relay.publications` whose owner stores `topic`'s messages."""
    digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def address(partition: int, inner: str) -> str:
    """The string a client holds for a stream or iterator of the owner of `partition`."""
    return f"{partition}.{inner}"


def parse_address(text: object, partitions: int) -> tuple[int, str]:
    """(partition, inner) of an addressed string, or `ValueError` saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    match = _ADDRESSED.match(text)
    if match is None:
        raise ValueError("not of the form <partition>.<token>")
    partition = int(match.group(1))
    if partition >= partitions:
        raise ValueError(f"partition {partition} does not exist ({partitions} partitions)")
    return partition, match.group(2)


def global_shard(owner_partition: int, shard: int) -> int:
    """A shard's number across every owner (its id in `/ds`, rank X of its streams)."""
    return owner_partition * SHARD_SPAN + shard
