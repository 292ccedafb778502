"""What a service process skips while it imports its modules, at the top of its console entry
point (`main()`), before anything else is imported.

- `rich` and `pygments` are never imported: structlog imports them when they are installed (for
  its console renderer and pretty tracebacks), and so does httpx (for its command-line
  client); services render JSON lines (`relay_runtime.logs`). They are in the environment for
  `relayctl` (typer). About 0.1-0.2 s of CPU at every start, a crashed replicator's way back
  included (issue 21).
- The cyclic garbage collector is off while the service's modules import (tens of thousands of
  objects, none of them garbage: class bodies, pydantic schemas), and back on after.

Invariant: only a console entry point uses this, through its service's `load()` (or a
process that forks instances from that: `relayctl up`, which has imported both already, so
nothing is hidden there; the tests' fork server; a test's child process standing for a
service: `tests/child.py`), because hiding them lasts for the whole process: importing either
afterwards raises `ImportError`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

HIDDEN = ("rich", "pygments")


def hide_renderers() -> None:
    """Make `rich` and `pygments` unimportable for the rest of this process."""
    for name in HIDDEN:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not importable"


@contextlib.contextmanager
def service_imports() -> Iterator[None]:
    """Import a service's modules inside this block."""
    hide_renderers()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
