"""Console entry point `relay-queue-writer`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_queue_writer.app import build
        from relay_queue_writer.settings import QueueWriterSettings
        from relay_runtime.serve import run_service
    run_service("relay-queue-writer", QueueWriterSettings, build)
