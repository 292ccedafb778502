"""A deterministic sequence of store-log changes, for the child process and the model alike."""

from __future__ import annotations

from typing import Any

from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog

DUMP_AFTER = 270


def record(i: int) -> QueueRecord:
    return QueueRecord(f"r{i:05d}", f"s{i:05d}", f"k{i}", 128, 1000 + i, 1000 + i)


def apply(store: StoreLog, i: int) -> None:
    if i < 200 or i > DUMP_AFTER:
        store.new(record(i))
    elif i < 250:
        store.set_status(f"r{(i - 200) * 2:05d}", "suspended", 5000 + i)
    elif i < DUMP_AFTER:
        store.delete(f"r{(i - 250) * 3 + 1:05d}")
    else:
        store.set_offsets({"epoch": "e1", "p0": 100})


def model(last: int) -> tuple[dict[str, QueueRecord], dict[str, Any]]:
    """The state after ops 0..last (inclusive)."""
    queues: dict[str, QueueRecord] = {}
    offsets: dict[str, Any] = {}
    for i in range(last + 1):
        if i < 200 or i > DUMP_AFTER:
            queues[record(i).recipient_id] = record(i)
        elif i < 250:
            rid = f"r{(i - 200) * 2:05d}"
            queues[rid] = queues[rid]._replace(status="suspended", updated_at=5000 + i)
        elif i < DUMP_AFTER:
            del queues[f"r{(i - 250) * 3 + 1:05d}"]
        else:
            offsets.update({"epoch": "e1", "p0": 100})
    return queues, offsets
