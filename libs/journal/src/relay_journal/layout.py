"""Where a queue's folder is: the base64url queue id split into path fragments.

Invariants:
- a queue id is base64url (`[A-Za-z0-9_-]`) and longer than the fragments, so it can never
  name a path outside `queues/` (no `..`, no separators);
- `layout.json` at the root records the fragment lengths in use and, while a migration runs,
  the ones it moves to; a queue is looked up under both until the migration has finished, and
  the migration can be stopped and resumed at any point (each folder moves by one rename).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from relay_durable.appendlog import fsync_dir
from relay_journal import errors

_ID = re.compile(r"^[A-Za-z0-9_-]+$")
LAYOUT_FILE = "layout.json"
LAYOUT_VERSION = 1
QUEUES_DIR = "queues"
STATE_FILE = "queue.log"
"""Every persisted queue folder has one, unless it was lost: a folder holding message files
without it is a queue too (loading rebuilds its state)."""


def validate_queue_id(queue_id: str, fragments: tuple[int, ...]) -> None:
    if not _ID.match(queue_id) or len(queue_id) <= sum(fragments):
        raise errors.InvalidQueueId(
            f"{queue_id!r} is not a base64url queue id longer than {sum(fragments)}"
        )


def relative_path(queue_id: str, fragments: tuple[int, ...]) -> Path:
    parts, at = [], 0
    for length in fragments:
        parts.append(queue_id[at : at + length])
        at += length
    parts.append(queue_id[at:])
    return Path(*parts)


@dataclass(frozen=True)
class Layout:
    current: tuple[int, ...]
    target: tuple[int, ...] | None = None
    """Set while a migration to another layout is under way."""

    def paths(self, root: Path, queue_id: str) -> list[Path]:
        """Where the queue may be; the first entry is where new folders go."""
        base = root / QUEUES_DIR
        if self.target is None:
            return [base / relative_path(queue_id, self.current)]
        return [
            base / relative_path(queue_id, self.target),
            base / relative_path(queue_id, self.current),
        ]

    @property
    def fragments_for_new(self) -> tuple[int, ...]:
        return self.target or self.current

    @property
    def longest(self) -> tuple[int, ...]:
        """The fragments a queue id must be longer than to have a folder in every layout in use."""
        return max((self.current, self.target or ()), key=sum)


def _write_layout(root: Path, layout: Layout) -> None:
    record = {"v": LAYOUT_VERSION, "fragments": list(layout.current)}
    if layout.target is not None:
        record["migrating_to"] = list(layout.target)
    tmp = root / (LAYOUT_FILE + ".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(root / LAYOUT_FILE)
    fsync_dir(root)


def load_layout(root: Path, default: tuple[int, ...]) -> Layout:
    """The layout recorded at `root`, recording `default` on first use."""
    path = root / LAYOUT_FILE
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        layout = Layout(default)
        _write_layout(root, layout)
        return layout
    try:
        record = json.loads(path.read_text())
        if record.get("v") != LAYOUT_VERSION:
            raise errors.CorruptJournal(f"{path}: unknown layout version {record.get('v')!r}")
        target = record.get("migrating_to")
        return Layout(tuple(record["fragments"]), tuple(target) if target else None)
    except (ValueError, KeyError, TypeError) as error:
        raise errors.CorruptJournal(f"{path} is unreadable: {error}") from None


def iter_queue_dirs(root: Path, fragments: tuple[int, ...]) -> Iterator[tuple[str, Path]]:
    """Every (queue id, folder) under the layout `fragments`, walking lazily."""

    def walk(folder: Path, depth: int, prefix: str) -> Iterator[tuple[str, Path]]:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except FileNotFoundError:
            return
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if depth < len(fragments):
                if len(entry.name) == fragments[depth]:
                    yield from walk(Path(entry.path), depth + 1, prefix + entry.name)
            elif _ID.match(entry.name) and is_queue_folder(entry.path):
                yield prefix + entry.name, Path(entry.path)

    yield from walk(root / QUEUES_DIR, 0, "")


def is_queue_folder(path: str | Path) -> bool:
    """Holds queue.log, or (queue.log lost) message files."""
    if os.path.exists(os.path.join(path, STATE_FILE)):
        return True
    try:  # queue.log lost: the message files still make it a queue (rarely reached)
        return any(
            name.startswith("messages.") and name.endswith(".log") for name in os.listdir(path)
        )
    except OSError:
        return False


def migrate(root: Path, to: tuple[int, ...], *, limit: int | None = None) -> tuple[int, bool]:
    """Move queue folders to the layout `to`; returns (moved, finished). Resumable: stop it
    anywhere (or pass `limit`) and run it again. Must not run while a journal is open."""
    layout = load_layout(root, to)
    if layout.target is None:
        if layout.current == to:
            return 0, True
        first = next(iter_queue_dirs(root, layout.current), None)
        if first is not None:  # queue ids have one length: refuse before anything moves
            validate_queue_id(first[0], to)
        layout = Layout(layout.current, to)
        _write_layout(root, layout)
    elif layout.target != to:
        raise errors.JournalError(f"a migration to {list(layout.target)} is already under way")
    moved = 0
    for queue_id, folder in iter_queue_dirs(root, layout.current):
        if limit is not None and moved >= limit:
            return moved, False
        validate_queue_id(queue_id, to)
        destination = root / QUEUES_DIR / relative_path(queue_id, to)
        if destination == folder:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, destination)
        fsync_dir(destination.parent)
        _remove_empty_parents(folder.parent, root / QUEUES_DIR)
        moved += 1
    _write_layout(root, Layout(to))
    return moved, True


def _remove_empty_parents(folder: Path, stop: Path) -> None:
    while folder != stop:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
