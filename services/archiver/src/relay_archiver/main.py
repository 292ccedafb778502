"""Console entry point `relay-archiver`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_archiver.app import build
        from relay_archiver.settings import ArchiverSettings
        from relay_runtime.serve import run_service
    run_service("relay-archiver", ArchiverSettings, build)
