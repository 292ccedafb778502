"""Restore from a rebuild into new data dirs through the engines: exported again, the restored
state equals the rebuild (split over two queue-writers by partition; retained messages and
durable streams, `$` topics included, split over two retainers), the journal marks are the
cut, and a used data dir or a bad ordinal is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay_archive import export, restore, tables, verify
from relay_archive.store import LocalStore
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_spark import jobs
from tests.spark import synthetic

PARTITIONS = 4
AT_MS = 1_700_000_000_000 + 86_400_000


@pytest.fixture
def rebuilt(tmp_path: Path) -> tuple[Path, tables.Cut]:
    store = LocalStore(tmp_path / "archive")
    made = synthetic.make(
        store,
        commands=1500,
        partitions=PARTITIONS,
        unanswered_every=50,
        retained=30,
        streams=40,
    )
    cut = tables.Cut(synthetic.EPOCH, AT_MS, made.commands)
    jobs.rebuild_python(store, cut, tmp_path / "rebuilt")
    return tmp_path / "rebuilt", cut


def test_restored_data_dirs_export_to_the_rebuild(
    rebuilt: tuple[Path, tables.Cut], tmp_path: Path
) -> None:
    folder, cut = rebuilt
    out = tmp_path / "export"
    marks: dict[int, int] = {}
    for k in range(2):
        data_dir = tmp_path / f"queue-writer-{k}"
        done = restore.restore_queue_writer(folder, data_dir, k, 2, PARTITIONS)
        assert done.queues > 0
        assert done.messages > 0
        assert done.marks is not None
        marks.update(done.marks)
        export.export_queue_writer(data_dir, out, data_dir.name, AT_MS)
        journal = QueueJournal(JournalSettings(root=data_dir / "journal"))
        try:
            assert journal.marks == {
                f"p{p}": f"{cut.epoch}:{o}" for p, o in (cut.offsets or {}).items() if p % 2 == k
            }
        finally:
            journal.close()
    assert marks == cut.offsets
    restored = [
        restore.restore_retainer(folder, tmp_path / f"retainer-{k}", k, 2, stream_shards=2)
        for k in range(2)
    ]
    assert sum(r.retained for r in restored) == 15
    for k in range(2):
        export.export_retainer(tmp_path / f"retainer-{k}", out, f"retainer-{k}")
    names = ("queues", "messages", "retained", "streams", "uncertain")
    mine = {n: tables.read_table(folder, n) for n in names}
    theirs = {n: tables.read_table(out, n) for n in names}
    assert verify.compare(mine, theirs, AT_MS) == []
    assert theirs["messages"].num_rows == mine["messages"].num_rows
    # 40 writes of 2 messages (all answered: one in 50 is not), a fifth on a `$` topic.
    assert sum(r.streams for r in restored) == mine["streams"].num_rows == 80
    assert all(r.streams > 0 for r in restored)
    topics = theirs["streams"].column("topic").to_pylist()
    assert topics.count("$ops/log") == mine["streams"].column("topic").to_pylist().count("$ops/log")
    assert "$ops/log" in topics


def test_a_used_data_dir_or_a_bad_ordinal_is_refused(
    rebuilt: tuple[Path, tables.Cut], tmp_path: Path
) -> None:
    folder, _ = rebuilt
    used = tmp_path / "used"
    (used / "journal").mkdir(parents=True)
    (used / "journal" / "layout.json").write_text("{}")
    with pytest.raises(restore.RestoreError, match="not empty"):
        restore.restore_queue_writer(folder, used, 0, 1, PARTITIONS)
    assert not (used / "store").exists()
    with pytest.raises(restore.RestoreError, match="ordinal 2"):
        restore.restore_queue_writer(folder, tmp_path / "new", 2, 2, PARTITIONS)
    assert not (tmp_path / "new").exists()
    with pytest.raises(restore.RestoreError, match="not a rebuild"):
        restore.restore_queue_writer(tmp_path, tmp_path / "new", 0, 1, PARTITIONS)
    streams = tmp_path / "retainer-used"
    (streams / "streams").mkdir(parents=True)
    (streams / "streams" / "site.json").write_text("{}")
    with pytest.raises(restore.RestoreError, match="not empty"):
        restore.restore_retainer(folder, streams, 0, 1)
    with pytest.raises(restore.RestoreError, match="stream shards"):
        restore.restore_retainer(folder, tmp_path / "new", 0, 1, stream_shards=0)
    assert not (tmp_path / "new").exists()
    assert not (streams / "retained").exists()


def test_a_rebuild_of_everything_archived_leaves_each_retainer_its_resume_points(
    rebuilt: tuple[Path, tables.Cut], tmp_path: Path
) -> None:
    """A cut with `resume` (no export): each restored retainer gets `resume.json` with the
    first offset not archived of each partition it owns (0 where nothing was); without it
    (a cut from an export), none. A damaged file is an error naming it, and `resumed` removes
    it."""
    folder, cut = rebuilt
    assert restore.read_resume(tmp_path / "nowhere") is None
    assert restore.restore_retainer(folder, tmp_path / "plain", 0, 1).marks is None
    assert restore.read_resume(tmp_path / "plain") is None
    (folder / "cut.json").write_text(
        tables.Cut(cut.epoch, cut.at_ms, cut.offsets, resume={0: 17, 1: 5, 2: 9}).to_json()
    )
    for k, expected in enumerate([{0: 17, 2: 9}, {1: 5, 3: 0}]):
        data_dir = tmp_path / f"retainer-{k}"
        done = restore.restore_retainer(folder, data_dir, k, 2, partitions=PARTITIONS)
        assert done.marks == expected
        assert restore.read_resume(data_dir) == restore.Resume(cut.epoch, expected)
    restore.resumed(tmp_path / "retainer-0")
    assert restore.read_resume(tmp_path / "retainer-0") is None
    (tmp_path / "retainer-1" / restore.RESUME_FILE).write_text('{"v": 1, "epoch": "e"}')
    with pytest.raises(restore.RestoreError, match="not a resume record"):
        restore.read_resume(tmp_path / "retainer-1")
