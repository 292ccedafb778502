"""Files written by the first journal format stay readable by every later build."""

from __future__ import annotations

import shutil
from pathlib import Path

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from tests.journal import make_fixture_v1 as fixture


def test_v1_store_reads_back(tmp_path: Path) -> None:
    root = tmp_path / "v1"
    shutil.copytree(fixture.ROOT, root)  # recovery may repair files: never touch the originals
    journal = QueueJournal(JournalSettings(root=root, **fixture.SETTINGS))  # type: ignore[arg-type]
    try:
        assert journal.check() == []
        assert [(m.body, m.ts_ms) for m in journal.messages(fixture.A)] == [
            (b"a1", fixture.T0 + 1),
            (b"a2", fixture.T0 + 2),
            (b"a10", fixture.T0 + 10),
        ]
        assert [(m.body, m.quota) for m in journal.messages(fixture.B)] == [
            (b"b20", False),
            (b"b21", False),
            (b"b22", False),
            (b"", True),
        ]
        assert not journal.info(fixture.B).can_write
        c = journal.info(fixture.C)
        assert c.suspended
        assert [m.expires_ms for m in journal.messages(fixture.C)] == [fixture.T0 + 31]
        assert [m.body for m in journal.messages(fixture.D)] == [b"d40"]  # replayed from the log
    finally:
        journal.close()
