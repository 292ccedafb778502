"""Timestamps as the status carries them: RFC 3339 UTC with milliseconds, read back exactly.

Pure: no clock is read here; callers pass `now`.
"""

from __future__ import annotations

import datetime


def iso(ts: float) -> str:
    """`ts` (Unix seconds) as `2026-01-02T03:04:05.678Z`."""
    moment = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text: str | None) -> float | None:
    """The Unix seconds of an `iso` string (any RFC 3339 form); None for None or garbage."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
