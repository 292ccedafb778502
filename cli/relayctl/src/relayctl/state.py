"""The run-state file of a suite started by `relayctl up`: `<data-dir>/run/relayctl.json`.

Invariant: the file exists only while that `relayctl up` runs (removed on a clean stop; a stale
one is recognised by its dead pid) and lists every child with its current pid and port, so
`relayctl status` and tests find the suite without guessing ports.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel

FORMAT_VERSION = 1


class ChildState(BaseModel):
    name: str
    pid: int | None
    port: int
    probe_url: str | None


class SuiteState(BaseModel):
    v: int = FORMAT_VERSION
    pid: int
    ingress_url: str
    children: list[ChildState]
    kafka: str = ""
    """The bootstrap servers the services use (empty in files written before it was kept)."""
    topic_prefix: str = ""
    """The services' `RELAY_KAFKA__TOPIC_PREFIX`: a suite sharing a cluster (`--kafka`) keeps
    its topics and groups apart under it."""


def state_path(data_dir: Path) -> Path:
    return data_dir / "run" / "relayctl.json"


def write_state(data_dir: Path, state: SuiteState) -> None:
    path = state_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def read_state(data_dir: Path) -> SuiteState | None:
    try:
        raw: Any = json.loads(state_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    return SuiteState.model_validate(raw)


def remove_state(data_dir: Path) -> None:
    state_path(data_dir).unlink(missing_ok=True)


def admin_token(data_dir: Path) -> str:
    """`RELAY_ADMIN_TOKEN` if set, else the token kept in `<data-dir>/admin-token` (made once)."""
    token = os.environ.get("RELAY_ADMIN_TOKEN")
    if token:
        return token
    path = data_dir / "admin-token"
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
