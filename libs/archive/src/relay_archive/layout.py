"""Where an archive file lives and what its name promises.

`<root>/v1/epoch=<E>/topic=<T>/partition=<P>/<T>+<P>+<first>+<last>.parquet`: one file holds
the records of one partition of one topic of one broker log (epoch, decision 0003) that the
archiver kept from offsets `first..last` (both included). The name is the file's coverage: the
archiver read every offset in the range, even those whose records it did not keep (the inbox's
deliveries, records this build cannot read), so a reader finds gaps from names alone.

Invariants:
- `parse(name_of(f)) == f` for every valid `ArchiveFile`, and `parse` refuses every other name
  with `BadArchiveName` (a temporary file, a foreign file, a range with `first > last`);
- the layout carries its version (`v1`) in the path: a reader skips versions it does not know
  rather than misread them (BRIEF §4, compatibility).

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAYOUT = "v1"
SUFFIX = ".parquet"
TEMP_PREFIX = ".tmp-"
"""Files being written carry this prefix until they are renamed (never read, removed at start)."""

_EPOCH = re.compile(r"[0-9A-Za-z_-]{1,64}")
_TOPIC = re.compile(r"[0-9A-Za-z._-]{1,200}")


class BadArchiveName(ValueError):
    """A path that is not an archive file of this layout."""


@dataclass(frozen=True, order=True)
class Slot:
    """One partition of one topic of one broker log: the unit the archiver resumes."""

    epoch: str
    topic: str
    partition: int

    def __post_init__(self) -> None:
        if not _EPOCH.fullmatch(self.epoch):
            raise BadArchiveName(f"epoch {self.epoch!r}: 1-64 of [0-9A-Za-z_-]")
        if not _TOPIC.fullmatch(self.topic):
            raise BadArchiveName(f"topic {self.topic!r}: 1-200 of [0-9A-Za-z._-]")
        if self.partition < 0:
            raise BadArchiveName(f"partition {self.partition} < 0")

    @property
    def folder(self) -> str:
        """The slot's folder, relative to the archive root."""
        return f"{LAYOUT}/epoch={self.epoch}/topic={self.topic}/partition={self.partition}"


@dataclass(frozen=True, order=True)
class ArchiveFile:
    slot: Slot
    first: int
    """First offset covered."""
    last: int
    """Last offset covered (included)."""

    def __post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise BadArchiveName(f"offset range {self.first}..{self.last}")

    @property
    def name(self) -> str:
        s = self.slot
        return f"{s.topic}+{s.partition}+{self.first}+{self.last}{SUFFIX}"

    @property
    def path(self) -> str:
        """Relative to the archive root."""
        return f"{self.slot.folder}/{self.name}"


def parse(path: str) -> ArchiveFile:
    """The file a relative path names, or `BadArchiveName`."""
    parts = path.strip("/").split("/")
    if len(parts) != 5 or parts[0] != LAYOUT:
        raise BadArchiveName(f"{path}: not {LAYOUT}/epoch=E/topic=T/partition=P/<file>")
    keys = ("epoch=", "topic=", "partition=")
    if not all(part.startswith(key) for part, key in zip(parts[1:4], keys, strict=True)):
        raise BadArchiveName(f"{path}: folders must be epoch=, topic=, partition=")
    epoch, topic, partition_text = (p.split("=", 1)[1] for p in parts[1:4])
    name = parts[4]
    if not name.endswith(SUFFIX) or name.startswith(TEMP_PREFIX):
        raise BadArchiveName(f"{path}: not a finished {SUFFIX} file")
    fields = name[: -len(SUFFIX)].rsplit("+", 3)
    if len(fields) != 4 or not all(f.isdigit() for f in fields[1:]) or not partition_text.isdigit():
        raise BadArchiveName(f"{path}: name is not <topic>+<partition>+<first>+<last>{SUFFIX}")
    slot = Slot(epoch, topic, int(partition_text))
    if fields[0] != topic or int(fields[1]) != slot.partition:
        raise BadArchiveName(f"{path}: name does not match its folder")
    return ArchiveFile(slot, int(fields[2]), int(fields[3]))


@dataclass(frozen=True)
class Coverage:
    """What the files of one slot cover: the offsets from `first` to `last` except `gaps`."""

    first: int
    last: int
    gaps: tuple[tuple[int, int], ...]
    """Ranges (both ends included) no file covers, between `first` and `last`."""
    overlaps: int
    """Offsets covered by more than one file (the reader keeps one copy)."""


def coverage(files: list[ArchiveFile]) -> Coverage | None:
    """The coverage of one slot's files (None for none)."""
    if not files:
        return None
    ordered = sorted(files, key=lambda f: (f.first, f.last))
    gaps: list[tuple[int, int]] = []
    overlaps = 0
    reached = ordered[0].last
    for f in ordered[1:]:
        if f.first > reached + 1:
            gaps.append((reached + 1, f.first - 1))
        elif f.first <= reached:
            overlaps += min(reached, f.last) - f.first + 1
        reached = max(reached, f.last)
    return Coverage(ordered[0].first, reached, tuple(gaps), overlaps)
