"""relay_kv: the replicated key-value rules of the replicator (seed 004), without I/O.

Modules: `clock` (hybrid logical clock versions), `crdt` (LWW registers, add-wins sets, maps and
their merge), `codec` (the versioned envelope of a stored value), `placement` (fixed shards,
rendezvous replica sets), `quorum` (write and read rounds, INDETERMINATE), `ops` (the client
operations on values), `setrows` (a set as a head and a row per member), `tombstones` (when a
tombstone may be purged), `hints` (hinted handoff records and limits), `tictac` (per-shard
hashes updated per write), `names` (namespace and key rules), `membership` (a join or leave
under way: dual writes, where reads go, when it may end).
"""
