"""Errors the journal raises. Refusals change nothing on disk or in memory."""

from __future__ import annotations


class JournalError(Exception):
    """Base class."""


class InvalidQueueId(JournalError):
    """Not a base64url id long enough for the folder layout."""


class QueueExists(JournalError):
    pass


class QuotaExceeded(JournalError):
    """The queue is full; the first refusal appended the quota marker."""


class QueueSuspended(JournalError):
    pass


class NoMessage(JournalError):
    """ACK of a message id that is not the head."""


class CorruptJournal(JournalError):
    """On-disk data this build cannot recover from without losing acknowledged writes."""
