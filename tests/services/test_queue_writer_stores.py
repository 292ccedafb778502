"""The queue-writer opens its journal and store log before it is ready, dumps on its timer, and
closes them on SIGTERM."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.helpers import BIN, Kafka, free_port, service_env


def test_stores_open_dump_on_the_timer_and_close(kafka: Kafka, tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "relay-queue-writer")],
        env=service_env(
            **kafka.env(),
            RELAY_HTTP__PORT=str(port),
            RELAY_DATA__DIR=str(tmp_path),
            RELAY_DUMP_INTERVAL_S="0.5",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        checks: dict[str, bool] = {}
        while time.monotonic() < deadline:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                checks = response.json()["checks"]
                if response.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert checks.get("stores") is True, checks
        assert (tmp_path / "journal" / "layout.json").exists()
        while not list((tmp_path / "store").glob("store-*.dump")):
            assert time.monotonic() < deadline, "no dump from the timer"
            time.sleep(0.1)
        process.terminate()
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
        assert '"event": "storelog_dumped"' in stderr
    finally:
        process.kill()
