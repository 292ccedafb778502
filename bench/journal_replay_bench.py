"""Journal restart after a crash with many active queues (issue 18).

    .venv/bin/python bench/journal_replay_bench.py [--queues 100000] [--log-mib 60]

A journal of `--queues` queues (one message each, then a checkpoint) gets writes round the
queues until `--log-mib` MiB are logged since that checkpoint (most of a 64 MiB segment), then
is abandoned as a SIGKILL leaves it (the log durable, nothing closed). A fresh process opens
the journal (replay and opening checkpoint) and reports `open_s`. Clean restarts replay
nothing; this is the case that replays a whole segment touching every queue. The last line
is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings

OPEN = """
import sys, time
from pathlib import Path
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
started = time.perf_counter()
QueueJournal(JournalSettings(root=Path(sys.argv[1]), max_queue_messages=10**6 - 1,
                             max_file_messages=10**6))
print(time.perf_counter() - started)
"""


def settings(root: Path) -> JournalSettings:
    return JournalSettings(root=root, max_queue_messages=10**6 - 1, max_file_messages=10**6)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--log-mib", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as folder:
        root = Path(folder) / "journal"
        journal = QueueJournal(settings(root))
        ids = [secrets.token_urlsafe(18) for _ in range(args.queues)]
        n = 0
        for queue in ids:
            n += 1
            journal.write(queue, n.to_bytes(24, "big"), b"x" * 256, ts_ms=1)
        journal.checkpoint()
        start = journal.wal.segment_bytes
        writes = 0
        while journal.wal.segment_bytes - start < args.log_mib << 20 and not journal.checkpointing:
            n += 1
            journal.write(ids[writes % len(ids)], n.to_bytes(24, "big"), b"x" * 256, ts_ms=1)
            writes += 1
        journal.sync()
        journal.wal.close()  # abandoned as a SIGKILL leaves it
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True, check=True
        )
        print(
            json.dumps(
                {
                    "queues": args.queues,
                    "writes_replayed": writes,
                    "open_s": round(float(out.stdout.split()[-1]), 2),
                    "process_s": round(time.perf_counter() - started, 2),
                    "load_avg_1m": os.getloadavg()[0],
                }
            )
        )


if __name__ == "__main__":
    main()
