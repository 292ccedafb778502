"""Durability primitives shared by Relay's storage engines (which never import each other):
`appendlog.AppendLog`, an append-only file with ordered flushes and shared fdatasyncs, and
`group_commit.GroupCommit`, which lets asyncio callers wait for durability in shared rounds."""
