"""A service process imports its modules without `rich` and with the garbage collector paused
(`relay_runtime.start`), and still logs, exceptions included, as JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVICES = ["archiver", "delivery", "ingress", "queue-writer", "replicator", "retainer"]
LOADED_EXTRAS = (
    'sorted(m for m, v in sys.modules.items() if v and m.split(".")[0] in ("rich", "pygments"))'
)
"""An expression, in the child: the modules of `rich` and `pygments` it imported."""


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_entry_point_imports_everything_but_rich(service: str) -> None:
    """The real entry point, stopped by a bad setting once its modules are imported."""
    package = "relay_" + service.replace("-", "_")
    code = f"""
import sys
try:
    from {package}.main import main
    main()
finally:
    print({LOADED_EXTRAS})
    print("{package}.app" in sys.modules, "structlog" in sys.modules)
"""
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env={"RELAY_HTTP__PORT": "not-a-port", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 78, ran.stderr[-2000:]
    assert ran.stdout.splitlines() == ["[]", "True True"]


def test_logs_and_tracebacks_render_without_rich() -> None:
    code = f"""
import gc, sys
from relay_runtime.start import service_imports
with service_imports():
    import structlog
    from relay_runtime.logs import configure_logging
assert gc.isenabled()
configure_logging("relay-test", "test-0")
try:
    1 / 0
except ZeroDivisionError:
    structlog.get_logger("t").exception("failed", n=1)
print({LOADED_EXTRAS})
"""
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert ran.stdout.strip() == "[]"
    line = json.loads(ran.stderr.strip().splitlines()[-1])
    assert line["event"] == "failed"
    assert line["n"] == 1
    assert line["service"] == "relay-test"
    assert "ZeroDivisionError: division by zero" in line["exception"]
