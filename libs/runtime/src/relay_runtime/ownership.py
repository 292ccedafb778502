"""Which share of the work a stateful instance owns, and the data directory that records it.

Invariant (BRIEF §3, ownership; decision 0019): instance k owns the partitions a
generation-numbered assignment (`relay_runtime.assignment`) gives it, never consumer-group
rebalancing and never `RELAY_DATA__REPLICAS` alone. `ownership.json` (version 2) in the data
directory records the newest assignment this instance accepted, written to a temporary file,
fsynced and renamed (then the directory fsynced), so a crash leaves the old record or the new
one. A version 1 record ({service, ordinal, replicas}: p mod n) reads as generation 1 of that
split and is rewritten as version 2 on the next record. A directory claimed by another service
or ordinal is refused.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from relay_runtime import assignment, exits, settings

_OWNERSHIP_FILE = "ownership.json"


def resolve_ordinal(data: settings.DataSettings, hostname: str | None = None) -> int:
    """`data.ordinal`, else the `-k` suffix of a StatefulSet pod name, else 0 for n == 1.

    An ordinal at or above `data.replicas` is allowed: the assignment, not n, decides what it
    owns (nothing, until a newer generation gives it partitions)."""
    if data.ordinal is not None:
        return data.ordinal
    match = re.search(r"-(\d+)$", hostname or socket.gethostname())
    if match is None and data.replicas > 1:
        raise exits.StartupError(
            "RELAY_DATA__ORDINAL is unset and the hostname has no -<ordinal> suffix",
            exits.EXIT_CONFIG,
        )
    return int(match.group(1)) if match else 0


def owned_partitions(partitions: int, ordinal: int, replicas: int) -> list[int]:
    """Partitions p with p mod n == k: the generation 1 split of a fresh pool."""
    return assignment.initial(partitions, replicas).owned(ordinal)


@dataclass(frozen=True)
class Recorded:
    """What a data directory holds: its claimant and the newest assignment it accepted."""

    service: str
    ordinal: int
    assignment: assignment.Assignment
    version: int


def read(data_dir: Path, service: str, ordinal: int, partitions: int) -> Recorded | None:
    """The data directory's record (None when it has none), migrated from version 1; a
    directory of another service or ordinal, or a corrupt record, is refused."""
    path = data_dir / _OWNERSHIP_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise exits.StartupError(
            f"data directory {data_dir} is not usable: {error.strerror}", exits.EXIT_OSERR
        ) from None
    try:
        record = json.loads(text)
        version = record.get("v")
        if version == 1:
            found = assignment.from_v1(record, partitions)
        elif version == assignment.FORMAT_VERSION:
            found = assignment.parse(record, partitions)
        else:
            raise assignment.InvalidAssignment("BAD_VERSION", f"unknown version {version!r}")
    except (json.JSONDecodeError, AttributeError, assignment.InvalidAssignment) as error:
        raise exits.StartupError(
            f"{path} is corrupt or not for {partitions} partitions ({error}); restore it or "
            "remove it to claim the directory again",
            exits.EXIT_CONFIG,
        ) from None
    if (record.get("service"), record.get("ordinal")) != (service, ordinal):
        raise exits.StartupError(
            f"{data_dir} belongs to {record.get('service')} instance {record.get('ordinal')}; "
            f"refusing to start as {service} instance {ordinal}",
            exits.EXIT_CONFIG,
        )
    return Recorded(service, ordinal, found, version)


def write(data_dir: Path, service: str, ordinal: int, accepted: assignment.Assignment) -> None:
    """Record `accepted` as this directory's newest assignment (version 2), durably."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / _OWNERSHIP_FILE
    record = {
        "v": assignment.FORMAT_VERSION,
        "service": service,
        "ordinal": ordinal,
        **accepted.to_json(),
    }
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)
    dir_fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def claim_data_dir(
    data_dir: Path, service: str, ordinal: int, partitions: int
) -> assignment.Assignment | None:
    """Create `data_dir` if needed and return the assignment it records (a version 1 record
    is rewritten as version 2 first), or None for a directory that records none."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        recorded = read(data_dir, service, ordinal, partitions)
        if recorded is not None and recorded.version != assignment.FORMAT_VERSION:
            write(data_dir, service, ordinal, recorded.assignment)
    except OSError as error:
        raise exits.StartupError(
            f"data directory {data_dir} is not usable: {error.strerror}", exits.EXIT_OSERR
        ) from None
    return None if recorded is None else recorded.assignment
