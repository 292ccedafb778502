"""Process exit codes and the one error type that carries them.

Invariant: a service that cannot start raises `StartupError`; the serving loop turns it into one
line on stderr and the code below, never a traceback. Codes follow sysexits(3).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a dependency (Kafka, Redis) did not answer in time
EXIT_OSERR = 71  # EX_OSERR: the OS refused a resource (port in use, data dir not writable)
EXIT_CONFIG = 78  # EX_CONFIG: a setting is missing or invalid


class StartupError(Exception):
    """A service cannot start; `str(self)` is the one line an operator reads."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
