"""Service instances for tests, started as `relayctl up` starts them (`relayctl.processes`):
forked from a process that imported every service once, running what the console script runs.

They are forked from `multiprocessing`'s fork server (one per test process: a fresh,
single-threaded interpreter that imports `tests.launcher_preload` as it starts), never from
the test process itself, whose threads (clients, nemeses, emulated kubelets) may hold a lock
at the moment of a fork; a forked child would wait for that lock forever.

Invariant: an instance is the fork server's child, not the test's; `relayctl.processes.Forked`
gives its pid (signals reach it directly) and its exit code (the server reaps it and reports).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import NoReturn

from relayctl import processes

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(["tests.launcher_preload"])


def start(script: Path, env: dict[str, str], log: Path) -> processes.Forked:
    """An instance of the service whose console script is `script` (`.../relay-<service>`),
    with `env`, logging to `log` (appended)."""
    process = _context.Process(
        target=_run,
        args=(script.name.removeprefix("relay-"), str(script), env, str(log)),
        name=script.name,
        daemon=False,  # a daemonic process may not start processes (the retainer's exports do)
    )
    process.start()
    return processes.Forked(process)


def _run(service: str, path: str, env: dict[str, str], log: str) -> NoReturn:
    from tests.launcher_preload import LOADED  # imported by the server before it forked

    processes.run_forked(LOADED[service], path, env, log, parent=None)
