from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings


def qid() -> str:
    return secrets.token_urlsafe(24)


def mid(n: int) -> bytes:
    return n.to_bytes(24, "big")


def small(root: Path, **overrides: object) -> JournalSettings:
    values: dict[str, object] = {
        "root": root,
        "max_queue_messages": 3,
        "max_file_messages": 4,
        "max_open_queues": 2,
        "state_compact_lines": 3,
    }
    values.update(overrides)
    return JournalSettings(**values)  # type: ignore[arg-type]


def drain(journal: QueueJournal, queue: str) -> list[bytes]:
    out = []
    while (message := journal.peek(queue)) is not None:
        out.append(message.body if not message.quota else b"<quota>")
        journal.ack(queue, message.msg_id)
    return out


@contextmanager
def logged_warnings() -> Iterator[list[str]]:
    """The events the journal logs at warning level (or above) inside the block."""
    found: list[str] = []
    with capture_logs() as entries:
        yield found
    found.extend(entry["event"] for entry in entries if entry["log_level"] in ("warning", "error"))


def open_files_under(folder: Path) -> list[str]:
    """This process's open file descriptors on files under `folder` (from /proc)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(f"{folder}/"):
            out.append(target)
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "journal"
