"""Console entry point `relay-replicator`."""

from __future__ import annotations

from relay_replicator.app import build
from relay_replicator.settings import ReplicatorSettings
from relay_runtime.serve import run_service


def main() -> None:
    run_service("relay-replicator", ReplicatorSettings, build)
