"""Which Kubernetes API answers are worth retrying, and how long to wait between tries.

Invariant: the delays grow geometrically from `base_s` and never exceed `cap_s`; only answers
that say "try again" (conflict, throttling, the server's own failures, no answer at all) are
retried, so a refusal (400, 403, 404, 422) is reported at once. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

RETRYABLE = frozenset({409, 429, 500, 502, 503, 504})
"""409 Conflict (a write raced another: read and apply again), 429 throttled, 5xx the server's."""


@dataclass(frozen=True)
class Backoff:
    attempts: int = 6
    """Tries in all, the first included."""
    base_s: float = 0.2
    """Wait after the first failure (seconds)."""
    factor: float = 2.0
    cap_s: float = 10.0
    """Longest wait between two tries (seconds)."""

    def delays(self) -> Iterator[float]:
        """The waits before the 2nd, 3rd, ... try: `attempts - 1` of them."""
        delay = self.base_s
        for _ in range(self.attempts - 1):
            yield min(delay, self.cap_s)
            delay *= self.factor


def retryable(status: int | None) -> bool:
    """None stands for no answer (connection refused or cut, timeout)."""
    return status is None or status in RETRYABLE
