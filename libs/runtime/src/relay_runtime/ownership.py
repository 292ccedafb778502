"""Which share of the work a stateful instance owns, and the data directory that records it.

Invariant (BRIEF §3, ownership): instance k of n owns a fixed set of partitions computed from k
and n, never from consumer-group rebalancing, and n is fixed per data directory: a start with a
different n is refused with a clear message, because the data on this volume belongs to the old
split. Moving to another n is a migration the operator drives.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

from relay_runtime import exits, settings

_OWNERSHIP_FILE = "ownership.json"
_FORMAT_VERSION = 1


def resolve_ordinal(data: settings.DataSettings, hostname: str | None = None) -> int:
    """`data.ordinal`, else the `-k` suffix of a StatefulSet pod name, else 0 for n == 1."""
    if data.ordinal is not None:
        ordinal = data.ordinal
    else:
        match = re.search(r"-(\d+)$", hostname or socket.gethostname())
        if match is None and data.replicas > 1:
            raise exits.StartupError(
                "RELAY_DATA__ORDINAL is unset and the hostname has no -<ordinal> suffix",
                exits.EXIT_CONFIG,
            )
        ordinal = int(match.group(1)) if match else 0
    if ordinal >= data.replicas:
        raise exits.StartupError(
            f"ordinal {ordinal} is out of range for {data.replicas} replicas", exits.EXIT_CONFIG
        )
    return ordinal


def owned_partitions(partitions: int, ordinal: int, replicas: int) -> list[int]:
    """Partitions p with p mod n == k: stable for a given (k, n), disjoint across k."""
    return [p for p in range(partitions) if p % replicas == ordinal]


def claim_data_dir(data_dir: Path, service: str, ordinal: int, replicas: int) -> None:
    """Create `data_dir` and record (service, ordinal, replicas) in it, or refuse a change."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / _OWNERSHIP_FILE
        if path.exists():
            recorded = json.loads(path.read_text())
            if (recorded.get("replicas"), recorded.get("ordinal")) != (replicas, ordinal):
                raise exits.StartupError(
                    f"{data_dir} belongs to {recorded.get('service')} instance "
                    f"{recorded.get('ordinal')} of {recorded.get('replicas')}; refusing to start "
                    f"as instance {ordinal} of {replicas} (changing the number of instances is a "
                    "migration)",
                    exits.EXIT_CONFIG,
                )
            return
        record = {
            "v": _FORMAT_VERSION,
            "service": service,
            "ordinal": ordinal,
            "replicas": replicas,
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
    except OSError as error:
        raise exits.StartupError(
            f"data directory {data_dir} is not usable: {error.strerror}", exits.EXIT_OSERR
        ) from None
    except json.JSONDecodeError:
        raise exits.StartupError(
            f"{data_dir / _OWNERSHIP_FILE} is corrupt; restore it or remove it to claim the "
            "directory again",
            exits.EXIT_CONFIG,
        ) from None
