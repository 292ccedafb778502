"""What every benchmark prints at the end: a readable table, then the JSON summary (last line)
with the machine and commit it was measured on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from typing import Any


def emit(summary: dict[str, Any]) -> None:
    summary = {
        **summary,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
    }
    width = max(len(key) for key in summary)
    for key, value in summary.items():
        print(f"{key:>{width}}: {value}")
    print(json.dumps(summary))
