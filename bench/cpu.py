"""CPU time of the processes a benchmark measures (servers and its own client): on two cores
they compete, so where the CPU goes is what bounds a saturated run."""

from __future__ import annotations

import contextlib

import psutil


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User and system CPU seconds so far of each process still running."""
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[name] = times.user + times.system
    return out
