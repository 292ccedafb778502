"""A service instance forked by `relayctl up` (`relayctl.processes.fork`) starts as its console
script would: its own environment, argv, title, session, stdin and log, default stop signals,
its service's `main` module as `__main__`; and exits with the code the script would. Real
forks of this process, real files."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

from relayctl import preload, processes

SCRIPT = "/opt/relay/bin/relay-example"


def _report() -> NoReturn:
    """A stand-in service: prints what it finds, then exits 3."""
    print(
        json.dumps(
            {
                "env": dict(os.environ),
                "argv": sys.argv,
                "main": sys.modules["__main__"].__name__,
                "title": Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode().strip(),
                "session_leader": os.getsid(0) == os.getpid(),
                "stdin_is_null": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
                "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                "sigint": signal.getsignal(signal.SIGINT) == signal.SIG_DFL,
            }
        ),
        flush=True,
    )
    sys.exit(3)


def _fail() -> NoReturn:
    raise RuntimeError("a bug at start")


def _wait_for_stop() -> NoReturn:
    print("serving", flush=True)
    while True:
        time.sleep(1)


def _service(serve: Any) -> preload.Service:
    return preload.Service(serve, __name__)


def _lines(log: Path) -> list[Any]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_an_instance_starts_as_its_console_script_would(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    log.write_text("an earlier run\n")
    env = {"RELAY_INSTANCE": "example-0", "ONLY": "this"}
    child = processes.fork(_service(_report), SCRIPT, env, log)
    assert child.wait(30) == 3
    assert log.read_text().startswith("an earlier run\n")  # appended
    [seen] = _lines(log)
    assert seen["env"] == env
    assert seen["argv"] == [SCRIPT]
    assert seen["main"] == __name__
    assert seen["title"] == "relay-example: example-0"
    assert {k for k, v in seen.items() if v is True} == {
        "session_leader",
        "stdin_is_null",
        "sigterm",
        "sigint",
    }
    assert os.environ.get("ONLY") is None  # relayctl's own environment is untouched


def test_an_uncaught_exception_exits_1_with_its_traceback_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    child = processes.fork(_service(_fail), SCRIPT, {}, log)
    assert child.wait(30) == 1
    assert "RuntimeError: a bug at start" in log.read_text()


def test_a_stop_signal_reaches_the_instance_and_not_relayctls_handler(tmp_path: Path) -> None:
    """relayctl's SIGTERM handler stops the whole suite; an instance signalled the moment it is
    forked must die of the signal (default action), not run that handler."""
    taken: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _: taken.append(sig))
    try:
        for _ in range(20):
            child = processes.fork(_service(_wait_for_stop), SCRIPT, {}, tmp_path / "x.log")
            child.send_signal(signal.SIGTERM)
            assert child.wait(30) == -signal.SIGTERM
        assert taken == []
        child = processes.fork(_service(_wait_for_stop), SCRIPT, {}, tmp_path / "y.log")
        deadline = time.monotonic() + 30
        log = tmp_path / "y.log"
        while not (log.exists() and "serving" in log.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_wait_times_out_like_popen(tmp_path: Path) -> None:
    import subprocess

    child = processes.fork(_service(_wait_for_stop), SCRIPT, {}, tmp_path / "x.log")
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.2)
        assert child.poll() is None
    finally:
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    child.send_signal(signal.SIGTERM)  # after exit: nothing is sent (its pid may be reused)


def test_every_service_registers_its_loader() -> None:
    """`relayctl up` forks what each service's own `load()` returns; a service missing from
    the entry points is named."""
    from relayctl import suite

    assert {e.name for e in preload.metadata.entry_points(group=preload.GROUP)} >= set(
        suite.SERVICES
    )
    with pytest.raises(LookupError, match="no-such-service"):
        preload.load_all(("no-such-service",))
