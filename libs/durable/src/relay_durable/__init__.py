"""Durability primitives shared by Relay's storage engines (which never import each other):
`appendlog.AppendLog`, an append-only file with ordered flushes and shared fdatasyncs,
`group_commit.GroupCommit`, which lets asyncio callers wait for durability in shared rounds, and
`batching.BatchLoop`, the batching loop of the services' writers and outboxes.

As the lowest layer, it also holds the few framework-free values every layer shares:
`codec` (base64url) and `outcome.Outcome` (what an operation answers)."""
