from __future__ import annotations

import secrets
from pathlib import Path

import pytest

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


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "journal"
