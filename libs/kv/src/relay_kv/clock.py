"""Versions: hybrid logical clock stamps with the writing site as the tie-break.

A version is (wall ms, logical counter, site). Its text form is fixed-width hex (lower case
for time and counter, the site id in upper case as `/ds` shows it)
(`12 + 4 + 16` characters), so comparing two version strings compares the versions; clients see
it as an opaque string "ordered by the server" (API.md).

Invariants:
- `HybridClock.tick()` returns a version strictly greater than every version it returned or
  `observe`d before, whatever the wall clock does (it may stand still or go back);
- `observe(v)` refuses (`TooFarAhead`) a version whose wall time is more than `max_ahead_ms`
  past this clock's wall time: one site with a clock running fast cannot drag every other
  site's versions into the future;
- the wall clock is injected (`now_ms`), so the rules are testable without time passing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_COUNTER = 0xFFFF
SITE_PATTERN = re.compile(r"^[0-9A-F]{16}$")
_TEXT = re.compile(r"^([0-9a-f]{12})([0-9a-f]{4})([0-9A-F]{16})$")


class TooFarAhead(ValueError):
    """A version stamped further in the future than the clocks may disagree."""


@dataclass(frozen=True, order=True)
class Version:
    wall_ms: int
    counter: int
    site: str

    def __str__(self) -> str:
        return f"{self.wall_ms:012x}{self.counter:04x}{self.site}"

    @classmethod
    def parse(cls, text: str) -> Version:
        found = _TEXT.match(text)
        if found is None:
            raise ValueError(f"not a version: {text!r}")
        return cls(int(found.group(1), 16), int(found.group(2), 16), found.group(3))

    def as_int(self) -> int:
        """Wall time and counter as one integer (a dot counter: ordered like the version)."""
        return self.wall_ms << 16 | self.counter


ZERO = Version(0, 0, "0" * 16)


class HybridClock:
    def __init__(self, site: str, now_ms: Callable[[], int], max_ahead_ms: int = 5_000) -> None:
        if not SITE_PATTERN.match(site):
            raise ValueError(
                f"a site id is 16 upper-case hex digits (as /ds shows it), got {site!r}"
            )
        self.site = site
        self.now_ms = now_ms
        self.max_ahead_ms = max_ahead_ms
        self._wall = 0
        self._counter = 0

    def tick(self) -> Version:
        now = self.now_ms()
        if now > self._wall:
            self._wall, self._counter = now, 0
        elif self._counter < MAX_COUNTER:
            self._counter += 1
        else:  # 65,536 stamps within one millisecond: borrow the next one
            self._wall, self._counter = self._wall + 1, 0
        return Version(self._wall, self._counter, self.site)

    def admissible(self, version: Version) -> bool:
        return version.wall_ms <= max(self.now_ms(), self._wall) + self.max_ahead_ms

    def observe(self, version: Version) -> None:
        """Move past `version` (a later `tick` is greater), or `TooFarAhead`."""
        if not self.admissible(version):
            raise TooFarAhead(
                f"version {version} is {version.wall_ms - self.now_ms()} ms ahead of this clock"
            )
        self._wall, self._counter = max(
            (self._wall, self._counter), (version.wall_ms, version.counter)
        )
