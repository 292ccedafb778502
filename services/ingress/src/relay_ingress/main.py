"""Console entry point `relay-ingress`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_ingress.app import build
        from relay_ingress.settings import IngressSettings
        from relay_runtime.serve import run_service
    run_service("relay-ingress", IngressSettings, build)
