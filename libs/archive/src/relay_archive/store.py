"""The archive's files on a local folder or on S3-compatible object storage (`pyarrow.fs`).

Invariants:
- `put` makes a file visible whole or not at all. On a local folder it writes a temporary
  name (`.tmp-…`) in the target folder, fsyncs the file, renames it and fsyncs the folder (and
  each folder above it up to the root, whose entries a new slot adds), so after a crash at
  any point the file is either absent (a temporary one may be left, removed by
  `clean_temporary` and never listed) or complete and durable. On object storage one PUT is
  already all or nothing, so the object is written under its final key directly;
- `list_files` returns only finished files of the current layout, sorted; anything else in the
  tree (temporary files, foreign files, other layout versions) is skipped, never misread;
- `read` checks the Parquet page checksums the writer stored: a damaged file raises
  `CorruptArchiveFile` naming it, never returns wrong rows.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from relay_archive import layout, rows
from relay_durable.appendlog import fsync_dir

COMPRESSION = "zstd"
WRITE_OPTIONS = {
    "compression": COMPRESSION,
    # Page checksums (CRC32): a flipped bit in a data page is reported by the reader instead of
    # decoding to another value; the footer's own checks catch a truncated file.
    "write_page_checksum": True,
}


class CorruptArchiveFile(Exception):
    """An archive file that cannot be read back as written."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ArchiveStore(Protocol):
    root: str

    def put(self, f: layout.ArchiveFile, table: pa.Table) -> int:
        """Write one file (whole or not at all); returns its size in bytes."""

    def list_files(self, folder: str = layout.LAYOUT) -> list[layout.ArchiveFile]:
        """Finished files under `folder` (relative to the root)."""

    def read(self, f: layout.ArchiveFile, columns: list[str] | None = None) -> pa.Table: ...

    def remove(self, f: layout.ArchiveFile) -> None: ...

    def clean_temporary(self) -> int:
        """Remove files a crashed writer left half-written; returns how many."""


def _read_table(filesystem: pafs.FileSystem, path: str, columns: list[str] | None) -> pa.Table:
    try:
        table = pq.read_table(
            path, filesystem=filesystem, columns=columns, page_checksum_verification=True
        )
    except (OSError, pa.ArrowException) as error:
        raise CorruptArchiveFile(path, str(error).splitlines()[0]) from None
    expected = (
        rows.SCHEMA if columns is None else pa.schema([rows.SCHEMA.field(c) for c in columns])
    )
    if not table.schema.equals(expected):
        raise CorruptArchiveFile(path, f"schema {table.schema} is not the archive's")
    return table


class LocalStore:
    """An archive in a local folder (the default: `<data-dir>/archive`)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._root = root
        self._fs = pafs.LocalFileSystem()

    def put(self, f: layout.ArchiveFile, table: pa.Table) -> int:
        folder = self._root / f.slot.folder
        new_root = not self._root.exists()
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f"{layout.TEMP_PREFIX}{uuid.uuid4().hex}-{f.name}"
        try:
            with temporary.open("wb") as out:
                pq.write_table(table, out, **WRITE_OPTIONS)
                out.flush()
                os.fsync(out.fileno())
            size = temporary.stat().st_size
            os.replace(temporary, folder / f.name)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        fsync_dir(folder)
        # A new slot's folders may have been created too: make each entry durable in its
        # parent, up to the root's own entry (`v1` lives in the root; a root made here lives
        # in its parent). Re-syncing an unchanged folder costs little, one file per roll.
        for parent in folder.relative_to(self._root).parents:
            fsync_dir(self._root / parent)
        if new_root:
            fsync_dir(self._root.parent)
        return size

    def list_files(self, folder: str = layout.LAYOUT) -> list[layout.ArchiveFile]:
        base = self._root / folder
        found = []
        for dirpath, _, names in os.walk(base):
            for name in names:
                relative = os.path.relpath(os.path.join(dirpath, name), self._root)
                try:
                    found.append(layout.parse(relative))
                except layout.BadArchiveName:
                    continue
        return sorted(found)

    def read(self, f: layout.ArchiveFile, columns: list[str] | None = None) -> pa.Table:
        return _read_table(self._fs, str(self._root / f.path), columns)

    def remove(self, f: layout.ArchiveFile) -> None:
        (self._root / f.path).unlink(missing_ok=True)

    def clean_temporary(self) -> int:
        removed = 0
        for dirpath, _, names in os.walk(self._root / layout.LAYOUT):
            for name in names:
                if name.startswith(layout.TEMP_PREFIX):
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
        return removed


class ObjectStore:
    """An archive under `uri` on any `pyarrow.fs` filesystem (`s3://bucket/prefix?...`).
    One PUT is atomic, so no temporary name is needed; nothing else changes."""

    def __init__(self, uri: str) -> None:
        self._fs, self._base = pafs.FileSystem.from_uri(uri)
        self.root = uri

    def _full(self, relative: str) -> str:
        return f"{self._base.rstrip('/')}/{relative}"

    def put(self, f: layout.ArchiveFile, table: pa.Table) -> int:
        path = self._full(f.path)
        self._fs.create_dir(self._full(f.slot.folder), recursive=True)
        with self._fs.open_output_stream(path) as out:
            pq.write_table(table, out, **WRITE_OPTIONS)
        size: int = self._fs.get_file_info(path).size
        return size

    def list_files(self, folder: str = layout.LAYOUT) -> list[layout.ArchiveFile]:
        selector = pafs.FileSelector(self._full(folder), recursive=True, allow_not_found=True)
        found = []
        prefix = self._base.rstrip("/") + "/"
        for info in self._fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            try:
                found.append(layout.parse(info.path.removeprefix(prefix)))
            except layout.BadArchiveName:
                continue
        return sorted(found)

    def read(self, f: layout.ArchiveFile, columns: list[str] | None = None) -> pa.Table:
        return _read_table(self._fs, self._full(f.path), columns)

    def remove(self, f: layout.ArchiveFile) -> None:
        self._fs.delete_file(self._full(f.path))

    def clean_temporary(self) -> int:
        return 0


def open_store(location: str) -> ArchiveStore:
    """A store for a local folder, or for a `pyarrow.fs` URI (`s3://…`, `file://…`)."""
    if "://" in location:
        return ObjectStore(location)
    return LocalStore(Path(location))
