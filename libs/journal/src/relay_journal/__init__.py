"""Relay's queue journal (seed 000): one folder per queue, message files plus a state file,
behind a shared write-ahead log that makes writes durable with group commit.

Entry points: `journal.QueueJournal` (the engine), `aio.AsyncJournal` (asyncio callers share
fsyncs), `settings.JournalSettings`. See docs/decisions/0004-queue-journal-wal.md.
"""
