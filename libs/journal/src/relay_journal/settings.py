"""The journal's one settings dataclass. Units are in the names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relay_durable.policy import FsyncPolicy

__all__ = ["FsyncPolicy", "JournalSettings"]


@dataclass(frozen=True)
class JournalSettings:
    root: Path
    """Folder holding `queues/`, `wal/` and `layout.json`."""
    path_fragments: tuple[int, ...] = (2, 2, 2, 2)
    """Lengths of the leading queue-id fragments that become folders: `ab/cd/ef/gh/<rest>`."""
    max_queue_messages: int = 128  # messages; the quota
    max_file_messages: int = 256  # messages per message file before rotation (> the quota)
    max_open_queues: int = 100_000  # queues with state in memory; idle ones beyond are closed
    max_open_files: int = 0
    """Queue-file handles held at once (0: the process's RLIMIT_NOFILE less 256, which is also
    the most); the least recently used are closed beyond it, their queues stay open."""
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_backends: tuple[str, ...] = ("uring", "aio")
    """Where `AsyncJournal` runs fdatasyncs: the first `relay_durable.kernel_sync` backend the
    host accepts, else a worker thread (`()`: always a thread)."""
    batch_interval_ms: int = 10
    """With FsyncPolicy.BATCH: `AsyncJournal` fsyncs in the background at this interval; the
    synchronous `QueueJournal` fsyncs in the first change that finds the last fsync this old."""
    wal_segment_bytes: int = 64 * 1024 * 1024  # 64 MiB; a checkpoint follows each full segment
    wal_spares: bool = True
    """Write WAL segments over spares prepared ahead (`relay_durable.prealloc`): zero-filled in
    the background once a segment has 1 MiB, or recycled from the segment a checkpoint retired.
    An fdatasync over written blocks skips the filesystem's own journal commit (~99 against
    ~165 µs here, decision 0004). Costs one spare segment of disk space, and on a fresh store
    two segments' worth of zeros written before recycling takes over."""
    send_key_window_s: int = 24 * 3600
    """How long a send key (`QueueJournal.write(key=...)`) is answered after its message's
    timestamp; its key file is deleted within a 24th of this after (`relay_journal.keys`)."""
    tail_unwritten_bytes: int = 64 * 1024 * 1024
    """Buffered appends a checkpoint's tail table carries in all (`relay_journal.tail`); a
    queue's beyond it are written to its write file at the checkpoint instead. Bounds the
    table's size and the memory buffered appends hold across checkpoints."""
    state_compact_lines: int = 16  # queue.log lines before it is compacted to one
    state_backups_keep: int = 3  # newest queue.<ts>.log backups always kept
    state_backups_max_age_s: int = 7 * 24 * 3600  # older backups beyond the newest N are removed

    def __post_init__(self) -> None:
        if not 0 < self.max_queue_messages < self.max_file_messages:
            raise ValueError("need 0 < max_queue_messages < max_file_messages")
        if not self.path_fragments or any(n <= 0 for n in self.path_fragments):
            raise ValueError("path_fragments must be positive lengths")
        if self.send_key_window_s < 1:
            raise ValueError("send_key_window_s must be at least 1")
        if self.max_open_queues < 1:
            raise ValueError("max_open_queues must be at least 1")
