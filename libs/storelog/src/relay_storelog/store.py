"""The queue store log: queue records, an append-only log, live dumps (seed 001).

Invariants:
- the state is the latest stable dump plus every later log, and every change is appended to
  the current log `store-(N).log` before it is visible; under `FsyncPolicy.ALWAYS` before the
  call returns;
- the state is held in layers: the latest dump read where it lies (`relay_storelog.dumpfile`,
  version 2: opened and checked at start, records decoded when asked for), under immutable
  maps of the changes since it (newest layer first; a deleted queue is a `None` entry). Only
  changed queues are in memory, so a start costs the same for any number of queues and a
  queue not yet asked for is read from the dump's index on demand. A version 1 dump (text
  lines) still loads, whole, into the changes, and a dump is started at once to convert it;
- a dump follows seed 001's eight steps. Only steps 1-4 (pause logging, snapshot by reference,
  switch to log N+1, resume) hold up changes; the snapshot is two map references, so the pause
  does not grow with the number of records (the changes so far become a frozen layer, a new
  empty one takes the next changes). Steps 5-8 (write `store-(N).dump.saving`, fsync,
  rename to `store-(N).dump` and fsync the folder, remove older dumps and logs) run on a
  thread while changes go on; the next change on the owner's thread then reads from the new
  dump and drops the layers it covers. A dump never overlaps another;
- a crash at any step leaves files from which restore rebuilds exactly the state before the
  crash: files it does not need are ignored with a warning naming them;
- a torn last record of the last log is ignored with a warning; any other unreadable record
  stops the start with `StoreLogCorrupt` naming file and line, unless `repair=True`, which
  skips such records and dumps at once, so the next start needs no repair.

Not thread-safe: changes come from one thread (the service's event loop); the dump thread only
reads its snapshot and its own files, and hands the new dump over through one attribute.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import immutables
import structlog

from relay_durable.appendlog import AppendLog, fsync_dir
from relay_durable.policy import FsyncPolicy
from relay_storelog import dumpfile, records
from relay_storelog.dumpfile import DumpFile
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


class Layer(NamedTuple):
    """Changes since the layer below: recipient id → record, or None for a deleted queue;
    sender id → recipient id of the queues created in this layer."""

    queues: immutables.Map[str, QueueRecord | None]
    senders: immutables.Map[str, str]


_EMPTY = Layer(immutables.Map(), immutables.Map())
_MISSING: Any = object()


class QueueView:
    """The queues at one moment, read-only: the layers over the dump. Immutable (every part
    is), so a dump thread may read it while changes go on."""

    def __init__(self, base: DumpFile | None, layers: tuple[Layer, ...], count: int) -> None:
        self.base = base
        self.layers = layers
        self.count = count

    def _in_layers(self, recipient_id: str) -> Any:
        """The newest layer's entry (a record, or None: deleted), or `_MISSING`."""
        for layer in self.layers:
            found = layer.queues.get(recipient_id, _MISSING)
            if found is not _MISSING:
                return found
        return _MISSING

    def get(self, recipient_id: str, default: QueueRecord | None = None) -> QueueRecord | None:
        found = self._in_layers(recipient_id)
        if found is not _MISSING:
            return default if found is None else found
        if self.base is not None:
            record = self.base.get(recipient_id)
            if record is not None:
                return record
        return default

    def by_sender(self, sender_id: str) -> QueueRecord | None:
        """The live queue with this sender id: each layer's and the dump's candidate is
        checked against the current record (a later layer may have deleted it)."""
        for layer in self.layers:
            recipient = layer.senders.get(sender_id)
            if recipient is not None:
                record = self.get(recipient)
                if record is not None and record.sender_id == sender_id:
                    return record
        if self.base is not None:
            dumped = self.base.by_sender(sender_id)
            if dumped is not None:
                record = self._in_layers(dumped.recipient_id)
                if record is _MISSING:
                    return dumped  # unchanged since the dump
                if record is not None and record.sender_id == sender_id:
                    return record  # type: ignore[no-any-return]
        return None

    def __getitem__(self, recipient_id: str) -> QueueRecord:
        record = self.get(recipient_id)
        if record is None:
            raise KeyError(recipient_id)
        return record

    def __contains__(self, recipient_id: object) -> bool:
        return isinstance(recipient_id, str) and self.get(recipient_id) is not None

    def __len__(self) -> int:
        return self.count

    def _changed(self) -> dict[str, QueueRecord | None]:
        """Every entry of the layers, the newest winning."""
        changed: dict[str, QueueRecord | None] = {}
        for layer in reversed(self.layers):
            changed.update(layer.queues.items())
        return changed

    def values(self) -> Iterator[QueueRecord]:
        """Every queue: the dump's in file order (as changed since), then the new ones."""
        changed = self._changed()
        if self.base is not None:
            for record in self.base.records():
                if record.recipient_id not in changed:
                    yield record
        for maybe in changed.values():
            if maybe is not None:
                yield maybe

    def for_dump(self) -> Iterator[QueueRecord | dumpfile.Frame]:
        """`values()` for the next dump: the dump's unchanged records as frames, copied
        without decoding."""
        changed = self._changed()
        if self.base is not None:
            for frame in self.base.frames():
                if frame.recipient_id not in changed:
                    yield frame
        for maybe in changed.values():
            if maybe is not None:
                yield maybe

    def items(self) -> Iterator[tuple[str, QueueRecord]]:
        for record in self.values():
            yield record.recipient_id, record

    def __iter__(self) -> Iterator[str]:
        for record in self.values():
            yield record.recipient_id

    def keys(self) -> Iterator[str]:
        return iter(self)


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
        self._base: DumpFile | None = None
        """The latest stable dump, version 2; None before the first (or for a version 1 one,
        whose records are all in the layers)."""
        self._top = _EMPTY
        """The layer taking changes."""
        self._lower: tuple[Layer, ...] = ()
        """Frozen layers (newest first) between `_top` and `_base`: what a running dump, or
        one that failed, is writing."""
        self._count = 0
        self._view: QueueView | None = None
        self._adopt: tuple[DumpFile, int] | None = None
        """Set by the dump thread: the new dump and how many layers (the lowest) it covers."""
        self.offsets: immutables.Map[str, Any] = immutables.Map()
        self.auto_sync = True
        self._seq = 0
        self._dump: threading.Thread | None = None
        self._dump_number = -1
        self.last_dump: DumpResult | None = None
        self.skipped = 0
        """Records skipped by a `repair` start."""
        self._converting = False
        self.number = self._restore(repair) + 1
        self.file = AppendLog(self._path(self.number, "log"))
        if self.skipped:
            # Make the repair stick: the dump replaces the files holding the skipped records,
            # so the next start is a plain one.
            self.dump()
            self.wait_dump()
            log.warning("storelog_repaired", skipped=self.skipped, dump=self.number - 1)
        elif self._converting:
            # A version 1 dump was read whole (slow at scale): write it as version 2 now, in
            # the background, so that the next start reads it in place.
            log.info("storelog_dump_converting", dump=self.number)
            self.dump()

    # -- the queues ------------------------------------------------------------------------

    @property
    def queues(self) -> QueueView:
        """Every queue, read-only, as of now (recipient id → record)."""
        view = self._view
        if view is None:
            view = self._view = QueueView(self._base, (self._top, *self._lower), self._count)
        return view

    @property
    def in_memory(self) -> int:
        """Queue entries held in memory (changed since the dump); the rest are read from it."""
        return sum(len(layer.queues) for layer in (self._top, *self._lower))

    def _adopt_dump(self) -> None:
        """Read from the dump a finished dump thread handed over, dropping the layers it
        covers (owner's thread only)."""
        adopt = self._adopt
        if adopt is None:
            return
        self._adopt = None
        base, covered = adopt
        self._base = base
        self._lower = self._lower[: len(self._lower) - covered]
        self._view = None

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
            self._load_dump(self._path(stable, "dump"), repair)
        for index, number in enumerate(logs):
            self._load(self._path(number, "log"), last=index == len(logs) - 1, repair=repair)
        everything = [n for numbers in files.values() for n in numbers]
        return max(everything, default=-1)

    def _load_dump(self, path: Path, repair: bool) -> None:
        if not dumpfile.is_v2(path):
            self._load(path, last=False, repair=repair)  # version 1: text lines, read whole
            self._converting = True
            return
        try:
            self._base = DumpFile(path)
        except dumpfile.DumpError as error:
            if not repair:
                raise StoreLogCorrupt(f"{path.name}: {error}") from None
            found, offsets, skipped = dumpfile.salvage(path)
            log.warning("storelog_dump_salvaged", at=path.name, error=str(error), kept=len(found))
            self.skipped += max(skipped, 1)
            changes = [records.Line("new", records.queue_to_data(r)) for r in found]
            self._apply_lines(path, changes, last=False, repair=True)
            self.offsets = immutables.Map(offsets)
            return
        self._count = len(self._base)
        self.offsets = immutables.Map(self._base.offsets)

    def _load(self, path: Path, *, last: bool, repair: bool) -> None:
        data = path.read_bytes()
        self._apply_lines(path, data.splitlines(keepends=True), last=last, repair=repair)

    def _apply_lines(
        self, path: Path, lines: Sequence[bytes | records.Line], *, last: bool, repair: bool
    ) -> None:
        # One bulk mutation per file: setting keys one by one on an immutable map would
        # build a new map per record.
        queues, senders, offsets = (
            self._top.queues.mutate(),
            self._top.senders.mutate(),
            self.offsets.mutate(),
        )
        try:
            for index, raw in enumerate(lines):
                try:
                    line = records.decode(raw) if isinstance(raw, bytes) else raw
                    self._count += _apply(line, queues, senders, offsets, self._lower, self._base)
                except (records.LineError, StoreLogError) as error:
                    where = f"{path.name} line {index + 1}"
                    if last and index == len(lines) - 1 and isinstance(raw, bytes):
                        log.warning("storelog_torn_record_ignored", at=where, error=str(error))
                        with path.open("r+b") as f:
                            f.truncate(path.stat().st_size - len(raw))
                        return
                    if not repair:
                        raise StoreLogCorrupt(f"{where}: {error}") from None
                    log.warning("storelog_record_skipped", at=where, error=str(error))
                    self.skipped += 1
        finally:
            self._top = Layer(queues.finish(), senders.finish())
            self.offsets = offsets.finish()
            self._view = None

    # -- changes ---------------------------------------------------------------------------

    def _change(self, kind: str, data: dict[str, Any]) -> int:
        self._adopt_dump()
        queues, senders, offsets = (
            self._top.queues.mutate(),
            self._top.senders.mutate(),
            self.offsets.mutate(),
        )
        # Validates first: a refused change raises before anything is written or replaced.
        counted = _apply(
            records.Line(kind, data), queues, senders, offsets, self._lower, self._base
        )
        self._top = Layer(queues.finish(), senders.finish())
        self.offsets = offsets.finish()
        self._count += counted
        self._view = None
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
        return self.queues.by_sender(sender_id)

    # -- dumps -----------------------------------------------------------------------------

    def _step(self, name: str) -> None:
        if self.settings.on_dump_step is not None:
            self.settings.on_dump_step(name)

    def dump(self) -> int:
        """Start a dump (seed 001's steps); returns its number N, or the running dump's."""
        if self._dump is not None and self._dump.is_alive():
            return self._dump_number
        self._adopt_dump()
        started = time.perf_counter()
        self._step("pause")  # 1. changes wait: they come from this thread, which is busy here
        queues, offsets = self.queues, self.offsets  # 2. snapshot by reference (immutable maps)
        # The changes so far freeze as a layer; the next ones go to a new, empty one.
        self._lower = (self._top, *self._lower)
        self._top = _EMPTY
        self._view = None
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
        queues: QueueView,
        offsets: immutables.Map[str, Any],
        started: float,
        pause_ms: float,
    ) -> None:
        saving = self._path(number, "dump.saving")
        with saving.open("wb") as f:  # 5. write dump N as .saving (version 2)
            size = dumpfile.write(f, queues.for_dump(), dict(offsets.items()))
            self._step("write")
            f.flush()
            os.fsync(f.fileno())  # 6. fsync it
            self._step("fsync")
        saving.rename(self._path(number, "dump"))  # 7. rename, fsync the folder
        fsync_dir(self.root)
        # Read back (and checked) once; the owner's thread switches to it at its next change.
        self._adopt = (DumpFile(self._path(number, "dump")), len(queues.layers))
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


def _apply(
    line: records.Line,
    queues: Any,
    senders: Any,
    offsets: Any,
    lower: tuple[Layer, ...],
    base: DumpFile | None,
) -> int:
    """Apply one record to the top layer's mutating maps, looking through the `lower` layers
    and the `base` dump; raises before changing anything if invalid. Returns the change in
    the number of queues."""

    def current(recipient_id: str) -> QueueRecord | None:
        found = queues.get(recipient_id, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[no-any-return]
        return QueueView(base, lower, 0).get(recipient_id)

    def by_sender(sender_id: str) -> QueueRecord | None:
        recipient = senders.get(sender_id)
        if recipient is not None:
            record = current(recipient)
            if record is not None and record.sender_id == sender_id:
                return record
        below = QueueView(base, lower, 0).by_sender(sender_id)
        if below is not None and current(below.recipient_id) == below:
            return below
        return None

    def existing(recipient_id: object) -> QueueRecord:
        record = current(recipient_id) if isinstance(recipient_id, str) else None
        if record is None:
            raise UnknownQueue(str(recipient_id))
        return record

    data = line.data
    if line.kind == "new":
        record = records.queue_from_data(data)
        if current(record.recipient_id) is not None or by_sender(record.sender_id) is not None:
            raise QueueExists(record.recipient_id)
        queues[record.recipient_id] = record
        senders[record.sender_id] = record.recipient_id
        return 1
    if line.kind == "status":
        record = existing(data.get("recipient_id"))
        if data.get("status") not in records.STATUSES:
            raise records.LineError("invalid status")
        updated_at = data.get("updated_at", record.updated_at)
        queues[record.recipient_id] = record._replace(status=data["status"], updated_at=updated_at)
        return 0
    if line.kind == "delete":
        record = existing(data.get("recipient_id"))
        if QueueView(base, lower, 0).get(record.recipient_id) is None:
            queues.pop(record.recipient_id)  # created in this layer: nothing below to hide
        else:
            queues[record.recipient_id] = None
        if senders.get(record.sender_id) == record.recipient_id:
            senders.pop(record.sender_id)
        return -1
    if line.kind == "offsets":
        for key, value in data.items():
            offsets[key] = value
    return 0
