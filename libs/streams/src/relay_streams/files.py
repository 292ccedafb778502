"""Small JSON records (`site.json`, `sites.json`, `db.json`) written atomically.

Invariant: a record file is either its previous content or its new content, never a mix: the
new text goes to `<name>.tmp`, is fsynced, renamed over the old file, and the folder is fsynced.
A record that does not parse, or whose `v` this code does not know, is `CorruptRecord` naming
the file; nothing is ever silently replaced by defaults.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from relay_durable.appendlog import fsync_dir
from relay_streams.errors import CorruptRecord

FORMAT = 1


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps({"v": FORMAT, **data}, indent=1, sort_keys=True) + "\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptRecord(f"{path}: not a valid record ({e})") from None
    if not isinstance(data, dict):
        raise CorruptRecord(f"{path}: not a valid record (not an object)")
    version = data.pop("v", None)
    if version != FORMAT:
        raise CorruptRecord(f"{path}: record format {version!r}, this code reads {FORMAT}")
    return data


def field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], path: Path) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CorruptRecord(f"{path}: field {name!r} is missing or has the wrong type")
    return value
