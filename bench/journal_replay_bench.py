"""Journal restart after a crash with many active queues (issue 18).

    .venv/bin/python bench/journal_replay_bench.py [--queues 100000] [--log-mib 60]

A journal of `--queues` queues (one message each, then a checkpoint) gets writes round the
queues until `--log-mib` MiB are logged since that checkpoint (most of a 64 MiB segment), then
is abandoned as a SIGKILL leaves it (the log durable, nothing closed). Two fresh processes open
copies of it side by side:
- eager (`QueueJournal(settings)`, what the CLI tools do): every queue's records applied and the
  opening checkpoint written before it returns: `eager_open_s`;
- lazy (`lazy=True`, what `AsyncJournal` and so the queue-writer do): `ready_s` until it
  serves, `first_write_s` for a durable write to a queue whose records were still pending,
  then the background catch-up as `AsyncJournal` runs it (`catch_up_s` in all, its longest
  step `catch_up_step_max_ms`: how long it holds the event loop at once), and the RSS.
Clean restarts replay nothing; this is the case that replays a whole segment touching every
queue. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings

EAGER = """
import sys, time
from pathlib import Path
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
started = time.perf_counter()
QueueJournal(JournalSettings(root=Path(sys.argv[1]), max_queue_messages=10**6 - 1,
                             max_file_messages=10**6))
print(time.perf_counter() - started)
"""

LAZY = """
import json, resource, sys, time
from pathlib import Path
from relay_journal.aio import CATCH_UP_STEP
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
started = time.perf_counter()
journal = QueueJournal(JournalSettings(root=Path(sys.argv[1]), max_queue_messages=10**6 - 1,
                                       max_file_messages=10**6), lazy=True)
ready = time.perf_counter() - started
pending = journal.pending_queues
rss_ready = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
started = time.perf_counter()
journal.write(sys.argv[2], bytes(24), b"first", ts_ms=2)
first = time.perf_counter() - started
steps = []
started = time.perf_counter()
while True:
    step = time.perf_counter()
    left = journal.catch_up(CATCH_UP_STEP, background=True)
    steps.append(time.perf_counter() - step)
    if not left:
        break
if journal.checkpoint_table is not None:
    journal.checkpoint_table.result()
journal.end_checkpoint()
print(json.dumps({"ready_s": ready, "pending_queues": pending, "first_write_s": first,
                  "catch_up_s": time.perf_counter() - started, "step_max_s": max(steps),
                  "rss_ready_mb": rss_ready,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
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
        copy = Path(folder) / "copy"
        shutil.copytree(root, copy)
        started = time.perf_counter()
        eager = subprocess.run(
            [sys.executable, "-c", EAGER, str(copy)], capture_output=True, text=True, check=True
        )
        eager_s = float(eager.stdout.split()[-1])
        lazy = subprocess.run(
            [sys.executable, "-c", LAZY, str(root), ids[len(ids) // 2]],
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(lazy.stdout.splitlines()[-1])
        print(
            json.dumps(
                {
                    "queues": args.queues,
                    "writes_replayed": writes,
                    "eager_open_s": round(eager_s, 2),
                    "ready_s": round(figures["ready_s"], 2),
                    "ready_vs_eager": round(figures["ready_s"] / eager_s, 3),
                    "pending_queues": figures["pending_queues"],
                    "first_write_ms": round(figures["first_write_s"] * 1000, 1),
                    "catch_up_s": round(figures["catch_up_s"], 2),
                    "catch_up_step_max_ms": round(figures["step_max_s"] * 1000, 1),
                    "rss_ready_mb": round(figures["rss_ready_mb"]),
                    "rss_caught_up_mb": round(figures["rss_mb"]),
                    "process_s": round(time.perf_counter() - started, 2),
                    "load_avg_1m": os.getloadavg()[0],
                }
            )
        )


if __name__ == "__main__":
    main()
