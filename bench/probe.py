"""How long a service's event loop is held while a benchmark runs: `/readyz` asked every 20 ms
from a thread, each answer timed (a loop held by a long step shows as a slow answer)."""

from __future__ import annotations

import threading
import time

import httpx


class ReadyProbe:
    """Asks the source's `/readyz` every 20 ms in a thread: how long its answers took while
    a move ran (an event loop held by a long step shows as a slow answer)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.took_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                client.get(f"{self.url}/readyz")
                self.took_ms.append((time.perf_counter() - started) * 1000)
                time.sleep(0.02)

    def worst_ms(self) -> float:
        return round(max(self.took_ms, default=0.0), 1)
