"""Console entry point `relay-replicator`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_replicator.app import build
        from relay_replicator.settings import ReplicatorSettings
        from relay_runtime.serve import run_service
    run_service("relay-replicator", ReplicatorSettings, build)
