"""Corruption: truncate or flip bytes at every offset of a small queue's files and of the log.
The journal opens, says what it found, recovers to a valid state and never crashes; it never
delivers a damaged message, what it delivers keeps the original order, and whenever it delivers
less than the undamaged store it has logged a warning (or `check` listed a problem), except for
cuts at a state line's or log record's end, which look like a valid older file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_journal.wal import read_segments
from tests.journal.conftest import logged_warnings, mid

QUEUE = "corruptqueueaaaaaaaaaaaaaaaaaaaa"
BODIES = [b"first", b"second message", b"third", b"fourth one"]


def _pristine(root: Path, *, close: bool) -> JournalSettings:
    """A queue with files on both sides of a rotation and a multi-line queue.log."""
    settings = JournalSettings(
        root=root, max_queue_messages=3, max_file_messages=4, state_compact_lines=8
    )
    journal = QueueJournal(settings)
    for n, body in enumerate(BODIES[:3]):
        journal.write(QUEUE, mid(n), body, ts_ms=n)
    journal.checkpoint()
    head = journal.peek(QUEUE)
    assert head is not None
    journal.ack(QUEUE, head.msg_id)
    journal.checkpoint()
    journal.write(QUEUE, mid(3), BODIES[3], ts_ms=3)
    if close:
        journal.close()
    else:
        journal.wal.close()  # a crash: the log holds what the queue files may lack
    return settings


def _delivered(
    settings: JournalSettings, *, expect_clean: bool = False, must_report: bool = True
) -> list[bytes]:
    with logged_warnings() as found:
        journal = QueueJournal(settings)
        try:
            problems = journal.check()  # reports damage, never raises
            assert all(isinstance(p, str) for p in problems)
            if expect_clean:
                assert problems == []
            out = []
            while (message := journal.peek(QUEUE)) is not None:
                out.append(message.body)
                journal.ack(QUEUE, message.msg_id)
        finally:
            journal.close()
    # Whatever it could not deliver, it said so.
    assert out == BODIES[1:] or found or problems or not must_report, (out, problems)
    return out


def _record_boundaries(path: Path) -> set[int]:
    """Where a state file or log segment can be cut and still look whole (just shorter): such a
    cut is a valid older state and cannot be told from one, so it cannot be reported."""
    data = path.read_bytes()
    if path.name == "queue.log":
        return {at + 1 for at, byte in enumerate(data) if byte == ord("\n")} | {0}
    if path.parent.name == "wal":
        return {0} | {at for _, _, at in read_segments([path])} | {len(data)}
    return set()


def _is_ordered_subset(got: list[bytes]) -> bool:
    at = 0
    for body in got:
        if body not in BODIES[at:]:
            return False
        at = BODIES.index(body, at) + 1
    return True


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "layout.json")


@pytest.mark.parametrize("close", [True, False], ids=["closed", "crashed"])
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_every_offset_of_every_file(tmp_path: Path, close: bool, damage: str) -> None:
    pristine_root = tmp_path / "pristine"
    _pristine(pristine_root, close=close)
    files = [p.relative_to(pristine_root) for p in _files(pristine_root)]
    assert any(f.name.startswith("messages.") for f in files)
    assert any(f.name == "queue.log" for f in files)
    cases = 0
    for relative in files:
        size = (pristine_root / relative).stat().st_size
        boundaries = _record_boundaries(pristine_root / relative) if damage == "truncate" else set()
        for offset in range(size):
            root = tmp_path / f"case-{cases}"
            shutil.copytree(pristine_root, root)
            target = root / relative
            data = bytearray(target.read_bytes())
            if damage == "truncate":
                del data[offset:]
            else:
                data[offset] ^= 0x5A
            target.write_bytes(bytes(data))
            settings = JournalSettings(
                root=root, max_queue_messages=3, max_file_messages=4, state_compact_lines=8
            )
            got = _delivered(settings, must_report=offset not in boundaries)
            assert _is_ordered_subset(got), (relative, offset, got)
            shutil.rmtree(root)
            cases += 1
    assert cases > 100


def test_undamaged_store_delivers_everything(tmp_path: Path) -> None:
    for close in (True, False):
        settings = _pristine(tmp_path / str(close), close=close)
        assert _delivered(settings, expect_clean=True) == BODIES[1:]
