"""Child for the dump crash tests: applies the script, dumps with a crash injected at STEP,
and keeps changing the store (printing each acknowledged change) until it is killed.

    python -m tests.storelog.dump_child ROOT STEP
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import structlog

from relay_storelog.store import StoreLog, StoreLogSettings
from tests.storelog import script


def main(root: Path, step: str) -> None:
    def crash(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    store = StoreLog(StoreLogSettings(root=root, on_dump_step=crash))
    for i in range(script.DUMP_AFTER + 1):
        script.apply(store, i)
        print(i, flush=True)
    store.dump()
    i = script.DUMP_AFTER + 1
    while True:  # changes after the snapshot, while the dump thread works
        script.apply(store, i)
        print(i, flush=True)
        i += 1
        if i > script.DUMP_AFTER + 5000:
            break
    store.close()


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    main(Path(sys.argv[1]), sys.argv[2])
