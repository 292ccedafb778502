"""Console entry point `relay-delivery`."""

from __future__ import annotations

from relay_runtime.start import service_imports


def main() -> None:
    with service_imports():
        from relay_delivery.app import build
        from relay_delivery.settings import DeliverySettings
        from relay_runtime.serve import run_service
    run_service("relay-delivery", DeliverySettings, build)
