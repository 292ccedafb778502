"""Queue store log benchmark (issue 5).

    .venv/bin/python bench/storelog_bench.py [--records 1000000] [--writers 100] [--seconds 5]

Measures, in one run: `log_records_per_s`, durable `new` records per second under
FsyncPolicy.ALWAYS from `--writers` concurrent asyncio writers (shared fsync rounds);
then, holding `--records` queue records: `dump_pause_ms` (how long changes waited: steps 1-4),
`dump_total_s` (all eight steps), `dump_bytes`, and `restore_s` (a fresh process opening the
dump). The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report

from relay_durable.policy import FsyncPolicy
from relay_storelog.aio import AsyncStoreLog
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings


def record(i: int) -> QueueRecord:
    return QueueRecord(
        f"r{i:031d}", f"s{i:031d}", f"k{i:042d}", 128, 1_700_000_000_000, 1_700_000_000_000
    )


async def durable_rate(root: Path, writers: int, seconds: float) -> float:
    store = AsyncStoreLog(StoreLogSettings(root=root))
    counter = iter(range(10**9))
    stop = time.perf_counter() + seconds

    async def writer() -> int:
        done = 0
        while time.perf_counter() < stop:
            await store.new(record(next(counter)))
            done += 1
        return done

    started = time.perf_counter()
    total = sum(await asyncio.gather(*(writer() for _ in range(writers))))
    elapsed = time.perf_counter() - started
    await store.close()
    return total / elapsed


def restore_child(root: str) -> None:
    started = time.perf_counter()
    store = StoreLog(StoreLogSettings(root=Path(root)))
    elapsed = time.perf_counter() - started
    print(json.dumps({"restore_s": elapsed, "records": len(store.queues)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--child-restore", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_restore:
        restore_child(args.child_restore)
        return
    Path("var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="storelog-bench-", dir="var"))
    try:
        rate = asyncio.run(durable_rate(work / "rate", args.writers, args.seconds))
        store = StoreLog(StoreLogSettings(root=work / "big", fsync=FsyncPolicy.NEVER))
        started = time.perf_counter()
        for i in range(args.records):
            store.new(record(i))
        fill_s = time.perf_counter() - started
        store.file.sync_to(store.file.written)  # steady state under ALWAYS: the log is durable
        store.dump()
        result = store.wait_dump()
        assert result is not None
        store.close()
        out = subprocess.run(
            [sys.executable, __file__, "--child-restore", str(work / "big")],
            capture_output=True,
            text=True,
            check=True,
        )
        restored = json.loads(out.stdout.strip().splitlines()[-1])
        assert restored["records"] == args.records
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        "benchmark": "storelog",
        "records": args.records,
        "log_records_per_s": round(rate),
        "writers": args.writers,
        "fill_s": round(fill_s, 1),
        "dump_pause_ms": round(result.pause_ms, 3),
        "dump_total_s": round(result.total_s, 2),
        "dump_bytes": result.bytes,
        "restore_s": round(restored["restore_s"], 2),
    }
    report.emit(summary)


if __name__ == "__main__":
    main()
