"""Readiness: a set of named conditions that must all hold before a service takes traffic.

Invariant: `ready` is true only while every registered condition is true; conditions are
registered up front, so a condition not yet reached counts as not ready.
"""

from __future__ import annotations

from prometheus_client import Gauge

_READY = Gauge("relay_ready", "1 while the named readiness condition holds", ["condition"])


class Readiness:
    """Named boolean conditions, mirrored into the `relay_ready` gauge."""

    def __init__(self, *conditions: str) -> None:
        self._state: dict[str, bool] = {}
        for name in conditions:
            self.register(name)

    def register(self, name: str) -> None:
        self._state.setdefault(name, False)
        _READY.labels(name).set(int(self._state[name]))

    def set(self, name: str, ok: bool) -> None:
        if name not in self._state:
            raise KeyError(f"unregistered readiness condition {name!r}")
        self._state[name] = ok
        _READY.labels(name).set(int(ok))

    @property
    def ready(self) -> bool:
        return all(self._state.values())

    def snapshot(self) -> dict[str, bool]:
        return dict(self._state)
