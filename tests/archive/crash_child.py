"""Crash-test child: writes archive files into `argv[1]` and SIGKILLs itself between a file's
fsync and its rename (the file complete under its temporary name), on file number `argv[2]`."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from relay_archive import layout, rows, writer
from relay_archive import store as store_module

root, kill_on = Path(sys.argv[1]), int(sys.argv[2])
written = 0
real_replace = os.replace


def replace_then_maybe_die(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    if written == kill_on:
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(source, target)


store_module.os.replace = replace_then_maybe_die  # type: ignore[assignment]
archive = store_module.LocalStore(root)
slot = layout.Slot("e1", "relay.queue.commands", 0)
for n in range(10):
    f = layout.ArchiveFile(slot, n * 10, n * 10 + 9)
    writer.write(
        archive,
        f,
        [rows.row_of(o, o, None, b'{"kind":"x","v":1}') for o in range(f.first, f.last + 1)],
    )
    written += 1
    print(written, flush=True)
