"""Console entry point `relay-retainer`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_retainer.app import build
        from relay_retainer.settings import RetainerSettings
        from relay_runtime.serve import run_service
    run_service("relay-retainer", RetainerSettings, build)
