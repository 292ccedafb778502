"""Console entry point `relay-retainer`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NoReturn

from relay_runtime.start import service_imports


def load() -> Callable[[], NoReturn]:
    """Import the service's modules (as `service_imports` says) and return what serves it.
    `relayctl up` calls this once for all its instances and forks each from the result
    (`relayctl.preload`, `relayctl.processes.fork`)."""
    with service_imports():
        from relay_retainer.app import build
        from relay_retainer.settings import RetainerSettings
        from relay_runtime.serve import run_service
    return functools.partial(run_service, "relay-retainer", RetainerSettings, build)


def main() -> None:
    load()()
