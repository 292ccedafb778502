"""Where delivery starts reading a partition it takes over: at a marker it writes there.

Invariant: the offsets returned are those of records this instance wrote after the takeover,
so everything read from them on happened after it (the embedded broker's end offsets are
unreliable, decision 0005); what came before is rebuilt from Redis instead.
"""

from __future__ import annotations

from relay_bus import schemas
from relay_bus.bus import Bus


async def write_markers(
    bus: Bus, topic: str, partitions: list[int], instance: str
) -> dict[int, int]:
    """Write one marker to each partition of `topic`; the offset to read each one from."""
    offsets = {}
    for partition in partitions:
        marker = schemas.Marker(instance=instance)
        _, offsets[partition] = await bus.send(topic, marker, partition=partition)
    return offsets
