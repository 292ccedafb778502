"""The retainer's online export against its writers (issue 22): how long writes wait while an
export runs, compared with the same writers without one.

    .venv/bin/python bench/retainer_export_bench.py [--writers 8] [--preload 20000]
        [--baseline-s 3] [--reader process|thread] [--exports 3]

A real retained store and stream store (4 shards) in a temporary data dir, opened by the
retainer's own hosts (`RetainedHost`, `StreamHost`), preloaded with `--preload` stream messages
and a thousand retained topics (so the memtables hold a few MiB to flush), then `--writers`
tasks that each hand over a retained write and a stream write in turn (with their log
positions, as the consumer does) and await each. Measured per write: the wait from hand-over
to durable. First `--baseline-s` without an export, then `--exports` runs of the retainer's
real export (`RetainerExports._export`: the live stores opened read-only and read by a
spawned child process, or on a thread with `--reader thread`), each with writers going on.
Reported: the longest and the 99th-percentile wait without an export, during each export
(and `pause_ms`, the export's own figure), the export's total time, and whether its cut was
exact. No broker: the export reads only the bus's epoch, given here. The last line is a
JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import report

from relay_bus import schemas
from relay_retainer.exports import RetainerExports
from relay_retainer.retained import RetainedHost
from relay_retainer.settings import RetainedServiceSettings, StreamSettings
from relay_retainer.streams import StreamHost
from relay_runtime.readiness import Readiness
from relay_streams.marks import Mark
from relay_streams.model import Message
from relay_streams.retained import Write

EPOCH = "bench"
PARTITIONS = 8


def _never() -> bool:
    return False


def _quantiles(waits: list[float]) -> dict[str, float]:
    if not waits:
        return {"writes": 0, "max_ms": 0.0, "p99_ms": 0.0, "median_ms": 0.0}
    ordered = sorted(waits)
    return {
        "writes": len(ordered),
        "max_ms": round(ordered[-1], 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "median_ms": round(statistics.median(ordered), 2),
    }


async def _preload(
    streams: StreamHost, retained: RetainedHost, position: Callable[[int], Mark], count: int
) -> None:
    """`count` stream messages and a thousand retained topics, so the memtables hold MiBs."""
    for n in range(0, count, 500):
        batch = [Message(f"pre/{(n + i) % 97}", b"x" * 200, 1_000 + n + i) for i in range(500)]
        await streams.store_batch("messages", batch, position(0), _never)
    for n in range(0, 1000, 100):
        writes = [Write(f"pre/{n + i}", b"y" * 200) for i in range(100)]
        for write in writes:
            retained.submit(write, position(1), _never)
        await retained.settled()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="retainer-export-bench-"))
    readiness = Readiness()
    streams = StreamHost(root / "streams", "bench", StreamSettings(shards=4), readiness)
    retained = RetainedHost(root / "retained", RetainedServiceSettings(), readiness)
    await streams.open()
    await retained.open()
    offsets = [0] * PARTITIONS
    bus: Any = SimpleNamespace(epoch=EPOCH)
    exports = RetainerExports(
        bus, streams, retained, "bench-0", root, range(PARTITIONS), args.reader
    )

    def position(partition: int) -> Mark:
        offsets[partition] += 1
        exports.positions[partition] = offsets[partition]
        return Mark(partition, EPOCH, offsets[partition])

    await _preload(streams, retained, position, args.preload)

    waits: list[tuple[float, float]] = []  # (when settled, ms waited)
    stop = asyncio.Event()

    async def writer(k: int) -> None:
        n = 0
        while not stop.is_set():
            partition = (k + n) % PARTITIONS
            began = time.perf_counter()
            if n % 2:
                await retained.submit(
                    Write(f"w/{k}/{n % 50}", b"%d" % n), position(partition), _never
                )
            else:
                message = Message(f"w/{k}/{n % 50}", b"%d" % n, 2_000_000 + n)
                await streams.store_batch("messages", [message], position(partition), _never)
            done = time.perf_counter()
            waits.append((done, (done - began) * 1000))
            n += 1

    tasks = [asyncio.create_task(writer(k)) for k in range(args.writers)]
    await asyncio.sleep(0.5)  # warm up
    began = time.perf_counter()
    await asyncio.sleep(args.baseline_s)
    baseline = _quantiles([ms for at, ms in waits if began <= at])
    runs = []
    for i in range(args.exports):
        started = time.perf_counter()
        request = schemas.AdminRequest(
            id=f"bench-{i}",
            origin="bench",
            reply_slot=0,
            deadline_ms=int(schemas.now_ms_()) + 600_000,
            op="export",
        )
        result = await exports._export(request)
        ended = time.perf_counter()
        during = _quantiles([ms for at, ms in waits if started <= at <= ended])
        runs.append(
            {
                **during,
                "pause_ms": result["pause_ms"],
                "before_ms": result["before_ms"],
                "total_s": result["total_s"],
                "exact": result["exact"],
                "streams": result["streams"],
            }
        )
        print(f"export {i}: {json.dumps(runs[-1])}", flush=True)
        await asyncio.sleep(3.0)  # the next export's `before_ms` window holds no export
    stop.set()
    await asyncio.gather(*tasks)
    await streams.close()
    await retained.close()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "bench": "retainer_export",
        "reader": args.reader,
        "writers": args.writers,
        "preload": args.preload,
        "baseline": baseline,
        "exports": runs,
        "during_max_ms": max(r["max_ms"] for r in runs),
        "exact": all(r["exact"] for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--preload", type=int, default=20_000)
    parser.add_argument("--baseline-s", type=float, default=3.0)
    parser.add_argument("--exports", type=int, default=3)
    parser.add_argument("--reader", choices=["process", "thread"], default="process")
    args = parser.parse_args()
    summary = asyncio.run(run(args))
    report.emit(summary)


if __name__ == "__main__":
    main()
