"""What the `/ds` rules refuse with. Each class is one answer of the API, so the ingress turns
them into its errors in one place: `Refused` is 400, `Unknown` 404, `TooLarge` 413."""

from __future__ import annotations


class Refused(ValueError):
    """The request is malformed or not allowed (a bad site id, a replica set too small, a live
    site to forget)."""


class Unknown(LookupError):
    """The request names a storage or a site that no retainer knows."""

    def __str__(self) -> str:  # LookupError's str() of one argument is its repr
        return str(self.args[0]) if self.args else ""


class TooLarge(ValueError):
    """The request is over one of its size limits."""


class BadToken(Refused):
    """An opaque stream or iterator string that no store made (or that was damaged)."""
