"""Files written by the first journal format stay readable by every later build."""

from __future__ import annotations

import shutil
from pathlib import Path

from relay_journal.journal import QueueJournal
from relay_journal.records import Op
from relay_journal.settings import JournalSettings
from relay_journal.wal import list_segments, read_segments
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


def test_v1_log_with_every_record_kind_replays(tmp_path: Path) -> None:
    segments = list_segments(fixture.WAL_ROOT)
    kinds = {record.op for record, _, _ in read_segments(segments)}
    # The fixture holds every kind of log record the first version wrote; MARK records came
    # later (within v1, read by `test_marks.py`), as did WRITE_KEYED (`test_send_keys.py`), so
    # it must not be rewritten to add them.
    assert kinds == set(Op) - {Op.MARK, Op.WRITE_KEYED}
    quota_markers = [
        record.message
        for record, _, _ in read_segments(segments)
        if record.message is not None and record.message.quota
    ]
    assert len(quota_markers) == 1
    root = tmp_path / "v1-wal"
    shutil.copytree(fixture.WAL_ROOT, root)
    journal = QueueJournal(JournalSettings(root=root, **fixture.SETTINGS))  # type: ignore[arg-type]
    try:
        assert journal.check() == []
        assert [m.body for m in journal.messages(fixture.E)] == [b"e4"]
        assert [m.body for m in journal.messages(fixture.F)] == [b"f1"]  # f0 expired
        assert journal.info(fixture.F).suspended
        assert [(m.body, m.quota) for m in journal.messages(fixture.K)] == [
            (b"k0", False),
            (b"k1", False),
            (b"k2", False),
            (b"", True),
        ]
        assert not journal.info(fixture.K).can_write
        for dropped in (fixture.G, fixture.H):  # deleted; emptied and closed
            assert not any(p.exists() for p in journal.layout.paths(root, dropped))
            assert journal.size(dropped) == 0
    finally:
        journal.close()
