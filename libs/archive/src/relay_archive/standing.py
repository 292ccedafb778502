"""Where an archived publication stands against a retainer's cut: applied in the state the
cut describes ("in"), left out of it ("out"), or unknown ("uncertain", counted as unanswered).

A retainer's online export reads, with each store's data, the store's marks
(`relay_streams.marks`): per partition, the first offset whose write that store does not hold.
A store is the retained store (`RETAINED`) or one shard of a stream database
(`stream_store`); a stream message's shard is `relay_streams.model.shard_of` of its topic
over the database's shard count, which the cut carries per partition. Where a store's
position is known the cut is exact for it; where it is not (a store from before marks), the
bounded window applies: before `lower` in, from `lower` to before `upper` uncertain, from
`upper` on out. No cut at all (an offline export of a stopped retainer): everything is in.

Pure: the plain-Python rebuild and the Spark workers call the same `PublicationCut`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from relay_streams.model import shard_of

Standing = Literal["in", "uncertain", "out"]

RETAINED = "retained"


def stream_store(db: str, shard: int) -> str:
    """The name of one stream shard in a cut."""
    return f"streams/{db}/{shard}"


@dataclass(frozen=True)
class PublicationCut:
    lower: dict[int, int] | None = None
    """Per partition, every record before it is in (None: no cut, everything is in)."""
    upper: dict[int, int] | None = None
    """Per partition, no record at or after it is in (None: `lower`)."""
    stores: dict[int, dict[str, int]] = field(default_factory=dict)
    """Partition → store → the first offset whose write the store does not hold (exact)."""
    shards: dict[int, dict[str, int]] = field(default_factory=dict)
    """Partition → stream database → its shard count at the owner."""

    def standing(self, partition: int, offset: int, store: str) -> Standing:
        exact = self.stores.get(partition, {}).get(store)
        if exact is not None:
            return "in" if offset < exact else "out"
        if self.lower is None:
            return "in"
        end = self.lower.get(partition, 0)
        upto = end if self.upper is None else self.upper.get(partition, end)
        if offset < end:
            return "in"
        return "uncertain" if offset < upto else "out"

    def retained(self, partition: int, offset: int) -> Standing:
        return self.standing(partition, offset, RETAINED)

    def stream(self, partition: int, offset: int, db: str, topic: str) -> Standing:
        """A message of a stream write: exact when its shard's position is known."""
        shards = self.shards.get(partition, {}).get(db)
        store = stream_store(db, shard_of(topic, shards)) if shards else ""
        return self.standing(partition, offset, store)
