"""Console entry point `relay-archiver`."""

from __future__ import annotations

from relay_archiver.app import build
from relay_archiver.settings import ArchiverSettings
from relay_runtime.serve import run_service


def main() -> None:
    run_service("relay-archiver", ArchiverSettings, build)
