"""Process exit codes, the one error type that carries them, and the fail-stop.

Invariants: a service that cannot start raises `StartupError`; the serving loop turns it into
one line on stderr and the code below, never a traceback. A service whose log can no longer be
made durable stops at once (`fail_stop`: no drain, nothing more answered; what was
acknowledged is on disk, and a restart reopens the log). Codes follow sysexits(3).
"""

from __future__ import annotations

import os
import sys

import structlog

EXIT_OK = 0
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: a dependency (Kafka, Redis) did not answer in time
EXIT_OSERR = 71  # EX_OSERR: the OS refused a resource (port in use, data dir not writable)
EXIT_IOERR = 74  # EX_IOERR: a log could not be made durable (fdatasync or its write failed)
EXIT_CONFIG = 78  # EX_CONFIG: a setting is missing or invalid


class StartupError(Exception):
    """A service cannot start; `str(self)` is the one line an operator reads."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fail_stop(error: OSError) -> None:
    """Stop the process now, exit code `EXIT_IOERR`: a store that can no longer make its log
    durable (after a failed fdatasync the kernel may have dropped the pages it could not write,
    so nothing later can be reported durable). Staying up would keep the instance Ready while
    every write fails; a restart reopens the log from what is on disk."""
    structlog.get_logger(__name__).critical("fail_stop", error=str(error), exit_code=EXIT_IOERR)
    sys.stderr.flush()
    os._exit(EXIT_IOERR)
