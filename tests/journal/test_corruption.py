"""Corruption: truncate or flip bytes at every offset of a small queue's files and of the log.
The journal opens, says what it found, recovers to a valid state and never crashes; it never
delivers a damaged message, and what it delivers keeps the original order."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from tests.journal.conftest import mid

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


def _delivered(settings: JournalSettings, *, expect_clean: bool = False) -> list[bytes]:
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
        return out
    finally:
        journal.close()


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
            got = _delivered(settings)
            assert _is_ordered_subset(got), (relative, offset, got)
            shutil.rmtree(root)
            cases += 1
    assert cases > 100


def test_undamaged_store_delivers_everything(tmp_path: Path) -> None:
    for close in (True, False):
        settings = _pristine(tmp_path / str(close), close=close)
        assert _delivered(settings, expect_clean=True) == BODIES[1:]
