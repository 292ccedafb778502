"""This replicator's site id: 16 hex digits (upper case, as `/ds` shows sites), chosen at random
the first time a data directory is used and kept in `<data dir>/kv/site.json`.

Invariant: `site.json` is written once (to a temporary file, fsynced, renamed, directory
fsynced) and never changed, so a rescheduled pod that keeps its volume keeps its site, and
placement (which hashes site ids) does not move.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from relay_kv.clock import SITE_PATTERN


def load_or_create_site(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "site.json"
    if not path.exists():
        temporary = path.with_suffix(".tmp")
        with temporary.open("w") as f:
            json.dump({"v": 1, "site": secrets.token_hex(8).upper()}, f)
            f.flush()
            os.fsync(f.fileno())
        temporary.rename(path)
        directory = os.open(root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    site = str(json.loads(path.read_text())["site"])
    if not SITE_PATTERN.match(site):
        raise ValueError(f"{path}: not a site id: {site!r}")
    return site
