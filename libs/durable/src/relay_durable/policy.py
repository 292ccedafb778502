"""When appended data is made durable."""

from __future__ import annotations

from enum import StrEnum


class FsyncPolicy(StrEnum):
    ALWAYS = "always"
    """A change returns only once it is durable (concurrent writers share one fsync)."""
    BATCH = "batch"
    """The log is fsynced every `batch_interval_ms`; a crash loses at most that window."""
    NEVER = "never"
    """The OS decides; only checkpoints and dumps fsync."""
