"""The queue store log: queue records in memory, an append-only log, live dumps (seed 001).

Invariants:
- the in-memory state (immutable maps) equals the latest stable dump plus every later log, and
  every change is appended to the current log `store-(N).log` before it is visible; under
  `FsyncPolicy.ALWAYS` before the call returns;
- a dump follows seed 001's eight steps. Only steps 1-4 (pause logging, snapshot by reference,
  switch to log N+1, resume) hold up changes; the snapshot is two map references, so the pause
  does not grow with the number of records. Steps 5-8 (write `store-(N).dump.saving`, fsync,
  rename to `store-(N).dump` and fsync the folder, remove older dumps and logs) run on a
  thread while changes go on. A dump never overlaps another;
- a crash at any step leaves files from which restore rebuilds exactly the state before the
  crash: files it does not need are ignored with a warning naming them;
- a torn last record of the last log is ignored with a warning; any other unreadable record
  stops the start with `StoreLogCorrupt` naming file and line, unless `repair=True`, which
  skips such records and dumps at once, so the next start needs no repair.

Not thread-safe: changes come from one thread (the service's event loop); the dump thread only
reads its snapshot and its own files.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import immutables
import structlog

from relay_durable.appendlog import AppendLog, fsync_dir
from relay_durable.policy import FsyncPolicy
from relay_storelog import records
from relay_storelog.records import QueueRecord

log = structlog.get_logger(__name__)

_FILE = re.compile(r"^store-(\d+)\.(log|dump|dump\.saving)$")
DUMP_STEPS = (
    "pause",
    "snapshot",
    "switch",
    "resume",
    "write",
    "fsync",
    "rename",
    "remove_dumps",
    "remove_logs",
)


class StoreLogError(Exception):
    pass


class StoreLogCorrupt(StoreLogError):
    pass


class QueueExists(StoreLogError):
    pass


class UnknownQueue(StoreLogError):
    pass


@dataclass(frozen=True)
class StoreLogSettings:
    root: Path
    """Folder of `store-(N).log` and `store-(N).dump` files."""
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    on_dump_step: Callable[[str], None] | None = None
    """Tests only: called after each dump step (one of `DUMP_STEPS`) with its name, to crash
    the process there (SIGKILL) or abandon the store mid-dump (raise)."""


@dataclass(frozen=True)
class DumpResult:
    number: int
    records: int
    bytes: int
    pause_ms: float
    total_s: float


class StoreLog:
    def __init__(self, settings: StoreLogSettings, *, repair: bool = False) -> None:
        self.settings = settings
        self.root = settings.root
        self.root.mkdir(parents=True, exist_ok=True)
        self.queues: immutables.Map[str, QueueRecord] = immutables.Map()
        self.senders: immutables.Map[str, str] = immutables.Map()
        self.offsets: immutables.Map[str, Any] = immutables.Map()
        self.auto_sync = True
        self._seq = 0
        self._dump: threading.Thread | None = None
        self._dump_number = -1
        self.last_dump: DumpResult | None = None
        self.skipped = 0
        """Records skipped by a `repair` start."""
        self.number = self._restore(repair) + 1
        self.file = AppendLog(self._path(self.number, "log"))
        if self.skipped:
            # Make the repair stick: the dump replaces the files holding the skipped records,
            # so the next start is a plain one.
            self.dump()
            self.wait_dump()
            log.warning("storelog_repaired", skipped=self.skipped, dump=self.number - 1)

    # -- files -----------------------------------------------------------------------------

    def _path(self, number: int, kind: str) -> Path:
        return self.root / f"store-{number}.{kind}"

    def _files(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {"log": [], "dump": [], "dump.saving": []}
        for name in os.listdir(self.root):
            match = _FILE.match(name)
            if match:
                found[match.group(2)].append(int(match.group(1)))
        return {kind: sorted(numbers) for kind, numbers in found.items()}

    # -- restore ---------------------------------------------------------------------------

    def _restore(self, repair: bool) -> int:
        """Load the latest stable dump and every later log; returns the highest file number."""
        files = self._files()
        stable = files["dump"][-1] if files["dump"] else -1
        for number in files["dump.saving"]:
            log.warning(
                "storelog_file_ignored",
                file=self._path(number, "dump.saving").name,
                why="unfinished dump",
            )
        for number in files["dump"][:-1]:
            log.warning(
                "storelog_file_ignored",
                file=self._path(number, "dump").name,
                why="older than the latest dump",
            )
        logs = [n for n in files["log"] if n > stable]
        for number in files["log"]:
            if number <= stable:
                log.warning(
                    "storelog_file_ignored",
                    file=self._path(number, "log").name,
                    why="covered by the latest dump",
                )
        if stable >= 0:
            self._load(self._path(stable, "dump"), last=False, repair=repair)
        for index, number in enumerate(logs):
            self._load(self._path(number, "log"), last=index == len(logs) - 1, repair=repair)
        everything = [n for numbers in files.values() for n in numbers]
        return max(everything, default=-1)

    def _load(self, path: Path, *, last: bool, repair: bool) -> None:
        data = path.read_bytes()
        lines = data.splitlines(keepends=True)
        # One bulk mutation per file: setting keys one by one on an immutable map would
        # build a new map per record.
        queues, senders, offsets = (
            self.queues.mutate(),
            self.senders.mutate(),
            self.offsets.mutate(),
        )
        try:
            for index, raw in enumerate(lines):
                try:
                    _apply(records.decode(raw), queues, senders, offsets)
                except (records.LineError, StoreLogError) as error:
                    where = f"{path.name} line {index + 1}"
                    if last and index == len(lines) - 1:
                        log.warning("storelog_torn_record_ignored", at=where, error=str(error))
                        with path.open("r+b") as f:
                            f.truncate(len(data) - len(raw))
                        return
                    if not repair:
                        raise StoreLogCorrupt(f"{where}: {error}") from None
                    log.warning("storelog_record_skipped", at=where, error=str(error))
                    self.skipped += 1
        finally:
            self.queues, self.senders, self.offsets = (
                queues.finish(),
                senders.finish(),
                offsets.finish(),
            )

    # -- changes ---------------------------------------------------------------------------

    def _change(self, kind: str, data: dict[str, Any]) -> int:
        queues, senders, offsets = (
            self.queues.mutate(),
            self.senders.mutate(),
            self.offsets.mutate(),
        )
        # Validates first: a refused change raises before anything is written or replaced.
        _apply(records.Line(kind, data), queues, senders, offsets)
        self.queues, self.senders, self.offsets = (
            queues.finish(),
            senders.finish(),
            offsets.finish(),
        )
        self._seq += 1
        self.file.append(self._seq, records.encode(kind, data))
        if self.auto_sync and self.settings.fsync is FsyncPolicy.ALWAYS:
            self.file.sync_to(self._seq)
        return self._seq

    def new(self, record: QueueRecord) -> int:
        return self._change("new", records.queue_to_data(record))

    def set_status(self, recipient_id: str, status: str, updated_at: int) -> int:
        return self._change(
            "status", {"recipient_id": recipient_id, "status": status, "updated_at": updated_at}
        )

    def delete(self, recipient_id: str) -> int:
        return self._change("delete", {"recipient_id": recipient_id})

    def set_offsets(self, offsets: dict[str, Any]) -> int:
        """Record applied Kafka positions, e.g. `{"epoch": "...", "p3": 1200}` (merged)."""
        return self._change("offsets", offsets)

    def by_sender(self, sender_id: str) -> QueueRecord | None:
        recipient = self.senders.get(sender_id)
        return None if recipient is None else self.queues[recipient]

    # -- dumps -----------------------------------------------------------------------------

    def _step(self, name: str) -> None:
        if self.settings.on_dump_step is not None:
            self.settings.on_dump_step(name)

    def dump(self) -> int:
        """Start a dump (seed 001's steps); returns its number N, or the running dump's."""
        if self._dump is not None and self._dump.is_alive():
            return self._dump_number
        started = time.perf_counter()
        self._step("pause")  # 1. changes wait: they come from this thread, which is busy here
        queues, offsets = self.queues, self.offsets  # 2. snapshot by reference (immutable maps)
        self._step("snapshot")
        number = self.number
        self.number += 1
        self.file.switch_to(self._path(self.number, "log"))  # 3. log N+1 (log N made durable)
        self._step("switch")
        pause_ms = (time.perf_counter() - started) * 1000  # 4. resume
        self._step("resume")
        self._dump_number = number
        self._dump = threading.Thread(
            target=self._write_dump,
            args=(number, queues, offsets, started, pause_ms),
            name=f"store-dump-{number}",
        )
        self._dump.start()
        return number

    def _write_dump(
        self,
        number: int,
        queues: immutables.Map[str, QueueRecord],
        offsets: immutables.Map[str, Any],
        started: float,
        pause_ms: float,
    ) -> None:
        saving = self._path(number, "dump.saving")
        size = 0
        with saving.open("wb") as f:  # 5. write dump N as .saving
            buffer = bytearray()
            for record in queues.values():
                buffer += records.encode("new", records.queue_to_data(record))
                if len(buffer) > 1 << 20:
                    f.write(buffer)
                    size += len(buffer)
                    buffer.clear()
            if offsets:
                buffer += records.encode("offsets", dict(offsets.items()))
            f.write(buffer)
            size += len(buffer)
            self._step("write")
            f.flush()
            os.fsync(f.fileno())  # 6. fsync it
            self._step("fsync")
        saving.rename(self._path(number, "dump"))  # 7. rename, fsync the folder
        fsync_dir(self.root)
        self._step("rename")
        files = self._files()
        for old in files["dump"] + files["dump.saving"]:  # 8. remove older dumps and logs
            if old < number:
                self._path(old, "dump").unlink(missing_ok=True)
                self._path(old, "dump.saving").unlink(missing_ok=True)
        self._step("remove_dumps")
        for old in files["log"]:
            if old <= number:
                self._path(old, "log").unlink(missing_ok=True)
        fsync_dir(self.root)
        self._step("remove_logs")
        total = time.perf_counter() - started
        self.last_dump = DumpResult(number, len(queues), size, pause_ms, total)
        log.info(
            "storelog_dumped",
            dump=number,
            records=len(queues),
            bytes=size,
            pause_ms=round(pause_ms, 3),
            total_s=round(total, 3),
        )

    def wait_dump(self) -> DumpResult | None:
        if self._dump is not None:
            self._dump.join()
        return self.last_dump

    def close(self) -> None:
        self.wait_dump()
        self.file.close()


def _get(queues: Any, recipient_id: object) -> QueueRecord:
    if not isinstance(recipient_id, str) or recipient_id not in queues:
        raise UnknownQueue(str(recipient_id))
    record: QueueRecord = queues[recipient_id]
    return record


def _apply(line: records.Line, queues: Any, senders: Any, offsets: Any) -> None:
    """Apply one record to the (mutating) maps; raises before changing anything if invalid."""
    data = line.data
    if line.kind == "new":
        record = records.queue_from_data(data)
        if record.recipient_id in queues or record.sender_id in senders:
            raise QueueExists(record.recipient_id)
        queues[record.recipient_id] = record
        senders[record.sender_id] = record.recipient_id
    elif line.kind == "status":
        current = _get(queues, data.get("recipient_id"))
        if data.get("status") not in records.STATUSES:
            raise records.LineError("invalid status")
        updated_at = data.get("updated_at", current.updated_at)
        queues[current.recipient_id] = current._replace(
            status=data["status"], updated_at=updated_at
        )
    elif line.kind == "delete":
        current = _get(queues, data.get("recipient_id"))
        del queues[current.recipient_id]
        del senders[current.sender_id]
    elif line.kind == "offsets":
        for key, value in data.items():
            offsets[key] = value
