"""Every service's modules, imported once by `relayctl up`, for its instances to be forked from.

A service's start is mostly its imports (FastAPI, pydantic schemas, the Kafka and Redis
clients): about 1 s of CPU each, paid again by every instance and every restart. `relayctl up`
imports them once (while the broker starts) and forks each instance from itself
(`processes.Child.start`), as gunicorn's `--preload` or Android's zygote do. A cluster runs each
service in its own container from its console script (`relay-<service>`), which calls the same
`load()` and runs what it returns: the same code runs either way.

Invariant: what `load_all` returns was imported by each service's own `load()` (its
`relay.services` entry point), and the objects alive then are frozen out of the cyclic
collector, in that process and in every instance forked after (their pages then stay shared).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from importlib import metadata
from typing import NoReturn

GROUP = "relay.services"
"""The entry-point group each service registers its `main.load` under (its pyproject)."""


@dataclasses.dataclass(frozen=True)
class Service:
    """One service's modules, imported: what its console script would run."""

    serve: Callable[[], NoReturn]
    main_module: str
    """Its `main` module, which its console script imports."""


def load_all(services: tuple[str, ...]) -> dict[str, Service]:
    """Each service's `load()`; then every object alive in this process is moved out of the
    cyclic collector's sight (`gc.freeze`): call it in a process that forks instances."""
    found = {entry.name: entry for entry in metadata.entry_points(group=GROUP)}
    missing = [name for name in services if name not in found]
    if missing:
        raise LookupError(
            f"no {GROUP!r} entry point for {', '.join(missing)}: is the environment set up "
            "(./dev setup)?"
        )
    loaded = {name: Service(found[name].load()(), found[name].module) for name in services}
    gc.collect()
    gc.freeze()
    return loaded
