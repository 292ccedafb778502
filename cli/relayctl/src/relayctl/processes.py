"""Child processes of `relayctl up`: start, watch, stop, with no orphans.

The broker and Redis are executed; a service instance is forked from relayctl, which has
imported every service's modules (`relayctl.preload`), and runs what its console script runs.

Invariants:
- every child is started with PR_SET_PDEATHSIG=SIGKILL, so it dies if relayctl itself is killed;
- every child runs in its own session: a terminal's Ctrl-C reaches relayctl only, which then
  stops the children in order (services first, then Redis and the broker);
- a forked instance, before any of its service's code runs: has SIGINT and SIGTERM at their
  default action (they are blocked in relayctl across the fork, so one sent then is neither
  lost nor taken by relayctl's handler); has /dev/null as stdin and its log as stdout and
  stderr; has exactly its given environment; has its console script as `sys.argv[0]` and
  process title, and its service's `main` module as `__main__` (a process it starts through
  multiprocessing imports that, not relayctl). It differs from an executed one in that `rich`
  and `pygments` are importable (relayctl renders with them), so
  `relay_runtime.start.hide_renderers` does not apply; it logs JSON lines all the same. Its
  exit code is the console script's: a `SystemExit`'s code, 1 for an uncaught exception (its
  traceback in the log), -N for signal N;
- `stop()` sends SIGTERM, waits up to the grace period, then SIGKILL, and reaps the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.process
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import setproctitle

from relayctl import preload

_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def die_with_parent() -> None:
    """Run in a child before exec: SIGKILL it when the process that started it dies."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Forked:
    """A forked service instance, with the parts of `subprocess.Popen` that `Child` uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@contextlib.contextmanager
def _stop_signals_blocked() -> Iterator[None]:
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def fork(service: preload.Service, script: str, env: dict[str, str], log_path: Path) -> Forked:
    """An instance of `service` run as `script` would run it, with `env`, logging to
    `log_path` (appended)."""
    process = multiprocessing.get_context("fork").Process(
        target=run_forked,
        args=(service, script, env, str(log_path), os.getpid()),
        name=Path(script).name,
        daemon=False,  # a daemonic process may not start processes (the retainer's exports do)
    )
    with _stop_signals_blocked():
        process.start()
    return Forked(process)


def run_forked(
    service: preload.Service, script: str, env: dict[str, str], log_path: str, parent: int | None
) -> NoReturn:
    """In a forked instance, before its service: the module's invariants. `parent`: the pid
    that forked it, which may have died before the instance was bound to die with it (checked
    after); None for a child of a fork server (`tests/launcher.py`), which is not the process
    that asked for it."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent()
    if parent is not None and os.getppid() != parent:  # it died before the line above
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(null)
    os.close(log)
    # New objects over the new descriptors, buffered as a started interpreter's would be: the
    # inherited ones may hold relayctl's unwritten text, or its locks.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    # The title first: it takes over the memory of argv and of the environment as it is now.
    setproctitle.setproctitle(f"{Path(script).name}: {env.get('RELAY_INSTANCE', '?')}")
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script]
    sys.modules["__main__"] = sys.modules[service.main_module]
    service.serve()


@dataclass
class Child:
    """One supervised process: a service instance, the broker or Redis."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    probe_url: str | None = None
    """`/readyz` of a service; None for the broker and Redis (probed by TCP connect)."""
    ready_text: str | None = None
    """Text the child logs once it serves (the broker: its port opens earlier than that)."""
    service: preload.Service | None = None
    """A service's imported modules: the child is forked and runs them, as its console script
    `command[0]` would, instead of executing it."""
    process: subprocess.Popen[bytes] | Forked | None = None
    restarts: list[float] = field(default_factory=list)
    _log_start: int = 0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_start = log.tell()
        if self.service is not None:
            self.process = fork(self.service, self.command[0], self.env, self.log_path)
            return
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - relayctl starts no threads
            )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def exit_code(self) -> int | None:
        return self.process.poll() if self.process else None

    def last_log_line(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def log_since_start(self) -> str:
        """What this run of the child has logged so far."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def logged_ready(self) -> bool:
        """`ready_text` appears in what this run of the child logged (True if none is set)."""
        return self.ready_text is None or self.ready_text in self.log_since_start()

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> bool:
        """Reap the process within `timeout_s`; True once it has exited."""
        if self.process is None:
            return True
        try:
            self.process.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        return True


def stop_all(children: list[Child], grace_s: float) -> list[str]:
    """SIGTERM all, wait together up to `grace_s`, SIGKILL the rest; names of those killed."""
    for child in children:
        child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = []
    for child in children:
        if not child.wait(deadline - time.monotonic()):
            child.signal(signal.SIGKILL)
            child.wait(5)
            killed.append(child.name)
    return killed


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORT_SPAN = 12_000
"""How many ports below the kernel's ephemeral range `free_port` chooses from."""


def ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (and `bind(0)`)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()
"""Every port `free_port` chose in this process: none is chosen twice. A suite picks all its
children's ports before any child binds one, so a port free at each pick could be handed to
two children (one then failed at start with "port in use")."""


def free_port(host: str) -> int:
    """A port free now, for a child to bind a moment later, and never chosen before by this
    process. Chosen at random below the kernel's ephemeral range: a port probed inside it (as
    `bind(0)` picks) can be taken meanwhile by any process's outgoing connection, which made a
    child fail with "port in use" on a busy machine. Falls back to `bind(0)` when no such port
    is free."""
    low = ephemeral_low()
    for _ in range(100):
        port = random.randrange(max(1024, low - PORT_SPAN), low)  # noqa: S311 - not a secret
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        found: int = sock.getsockname()[1]
        return found


def port_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
