"""Console entry point `relay-ingress`."""

from __future__ import annotations

from relay_ingress.app import build
from relay_ingress.settings import IngressSettings
from relay_runtime.serve import run_service


def main() -> None:
    run_service("relay-ingress", IngressSettings, build)
