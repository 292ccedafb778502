"""SIGKILL while writing: every acknowledged message survives, and the store checks clean."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from relay_streams.store import StreamStore
from tests.helpers import kill_when_acked
from tests.streams.conftest import replay


def test_acknowledged_messages_survive_sigkill(tmp_path: Path) -> None:
    # A process kill leaves the page cache alone, so tmpfs (fsync for free) tests the same thing.
    shm = Path("/dev/shm")
    if shm.is_dir():
        tmp_path = Path(tempfile.mkdtemp(prefix="streams-crash-", dir=shm))
    try:
        _rounds(tmp_path)
    finally:
        if tmp_path.is_relative_to(shm):
            shutil.rmtree(tmp_path, ignore_errors=True)


def _rounds(tmp_path: Path) -> None:
    for round_ in range(3):
        acked = kill_when_acked(
            "tests.streams.crash_child", str(tmp_path), count=250 * (round_ + 1)
        )
        assert acked > 0
        store = StreamStore(tmp_path)
        db = store.open_db("m")
        assert db.check() == []
        numbers = sorted(int(m.payload) for m in replay(db, "#"))
        # Each round starts over at 1 (same topics and payloads); nothing acknowledged is lost.
        assert set(range(1, acked + 1)) <= set(numbers)
        store.close()
