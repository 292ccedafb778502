"""CPU time of the processes a benchmark measures (servers and its own client): on two cores
they compete, so where the CPU goes is what bounds a saturated run."""

from __future__ import annotations

import contextlib
import pathlib

import psutil


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User and system CPU seconds so far of each process still running."""
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[name] = times.user + times.system
    return out


def jit_cpu_seconds(pid: int) -> float:
    """CPU seconds so far of a JVM's JIT compiler threads (`C1 CompilerThre`, `C2 ...`, named
    in Linux's /proc): while they are busy, the JVM is still warming up and its CPU per
    request is not yet its steady state."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        for thread in process.threads():
            comm = pathlib.Path(f"/proc/{pid}/task/{thread.id}/comm")
            with contextlib.suppress(OSError):
                if "CompilerThre" in comm.read_text():
                    total += thread.user_time + thread.system_time
    return total
