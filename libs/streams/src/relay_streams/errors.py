"""Exceptions of the stream store.

`BadInput` (and `relay_topics.rules.TopicError`) means the caller's input was refused and
nothing changed; the service maps it to 400 (`NotFound` to 404). `CorruptRecord` and
`UnknownLayout` mean data on disk cannot be read by this code; `WriteFailed` means a write did
not become durable.
"""

from __future__ import annotations

from relay_ds import errors as ds_errors


class StreamsError(Exception):
    pass


class BadInput(StreamsError, ValueError):
    """Refused input (message, token, settings, replica set); nothing was changed."""


class BadToken(BadInput, ds_errors.BadToken):
    """An opaque stream or iterator string that this store did not make (or that was damaged).
    Also a `relay_ds.errors.BadToken`, which the token format itself raises."""


class NotFound(StreamsError, LookupError):
    """Unknown database, generation or site."""


class Closed(StreamsError):
    """The store or database was closed."""


class CorruptRecord(StreamsError):
    """A record on disk that does not decode; the message names the file or key."""


class UnknownLayout(StreamsError):
    """A generation written by a layout (or layout version) this code does not know."""


class WriteFailed(StreamsError):
    """The storage engine refused a write; none of the batch is acknowledged."""
