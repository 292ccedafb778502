"""Archive rebuild benchmark (issue 22): Spark against the plain-Python replay of the same
archive.

    .venv/bin/python bench/archive_bench.py [--commands 250000,1000000] [--partitions 8]

For each size: a synthetic archive of that many queue commands, each with its reply on the
inbox (2 archived records per command; `tests/spark/synthetic.py`: creates, sends, acks,
suspends across partitions), written through the archive's own writer (zstd Parquet, 50,000
records a file). Measured: `bytes_per_record` of the archive, `python_s` (the plain replay,
`relay_spark.jobs.rebuild_python`, one process), `spark_s` (`relay_spark.jobs.rebuild` on
`--master`, session already started) and `spark_session_s` (reported apart, once). Both
rebuilds write the same tables; their row counts are checked equal. The last line is a JSON
summary.

    .venv/bin/python bench/archive_bench.py --live [--senders 64 --queues 1000 --seconds 30]

The archiver under load instead: `queues_bench`'s Relay run (`relayctl up`, its archiver among
the processes; senders awaiting each 201, receivers acking over WebSocket, 0 missing checked),
with the archiver's `/metrics` sampled every 0.5 s through the measured window (files rolled
every `--roll-age-s`, 10 s, instead of the default 60 s, lag measured every second): records
appended to the archived topics per second (`bus_records_per_s`, from the resume offsets plus
the lag), records archived per second, the largest lag, the archiver's CPU per 1,000 records,
archive bytes per record, and, once the senders stop, how long the lag takes to reach 0 (the
archiver writes a file at a size or an age, so lag is never below what one file gathers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import queues_bench
import report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.spark import synthetic  # noqa: E402

from relay_archive import tables  # noqa: E402
from relay_archive.store import LocalStore  # noqa: E402


def archiver_figures(url: str) -> dict[str, float]:
    """Sums over topics and partitions of the archiver's counters and gauges."""
    wanted = {
        "relay_archiver_resume_offset": "resume",
        "relay_archiver_lag_records": "lag",
        "relay_archiver_records_total": "records",
        "relay_archiver_bytes_total": "bytes",
    }
    found = dict.fromkeys(wanted.values(), 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            found[wanted[name]] += float(line.rsplit(" ", 1)[1])
    return found


def live(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="archive-live-", dir=ROOT / "var"))
    # The suite's children inherit it: files roll often enough for the window to see steady
    # state (the default 60 s would show nothing archived in a shorter window).
    os.environ["RELAY_ARCHIVE__ROLL_AGE_S"] = str(args.roll_age_s)
    os.environ["RELAY_ARCHIVE__LAG_INTERVAL_S"] = "1"
    relay = queues_bench.Relay(work)
    try:
        archiver = next(
            c for c in relay.state()["children"] if c["name"].startswith("relay-archiver")
        )
        url = archiver["probe_url"].removesuffix("/readyz")
        samples: list[tuple[float, dict[str, float]]] = []
        cpu: dict[str, float] = {}

        async def observe() -> None:
            pid = {"archiver": archiver["pid"]}
            before = queues_bench.cpu_seconds(pid)
            ends = time.monotonic() + args.seconds
            while time.monotonic() < ends:
                samples.append((time.monotonic(), await asyncio.to_thread(archiver_figures, url)))
                await asyncio.sleep(0.5)
            cpu.update(queues_bench.cpu_seconds(pid))
            cpu["used"] = cpu["archiver"] - before["archiver"]

        load = argparse.Namespace(
            queues=args.queues,
            senders=args.senders,
            receivers=args.receivers,
            seconds=args.seconds,
            warmup=args.warmup,
            window=64,
            rate=None,
        )
        result = asyncio.run(
            queues_bench.measure(relay, load, lambda: asyncio.ensure_future(observe()))
        )
        stopped = time.monotonic()
        drained_s = None
        while time.monotonic() - stopped < 180:
            if archiver_figures(url)["lag"] == 0:
                drained_s = round(time.monotonic() - stopped, 1)
                break
            time.sleep(0.5)
    finally:
        relay.stop()
        shutil.rmtree(work, ignore_errors=True)
    (t0, first), (t1, last) = samples[0], samples[-1]
    span = t1 - t0
    archived = last["resume"] - first["resume"]
    appended = archived + last["lag"] - first["lag"]
    written = last["records"] - first["records"]
    return {
        "live_roll_age_s": args.roll_age_s,
        "live_senders": args.senders,
        "live_queues": args.queues,
        "live_msgs_per_s": result["msgs_per_s"],
        "live_missing": result["missing"],
        "live_bus_records_per_s": round(appended / span),
        "live_archived_records_per_s": round(archived / span),
        "live_max_lag_records": max(figures["lag"] for _, figures in samples),
        "live_lag_drained_s": drained_s,
        "live_archiver_cpu_s_per_1000": round(cpu["used"] / max(archived, 1) * 1000, 3),
        "live_archiver_cpu_share": round(cpu["used"] / span, 3),
        "live_bytes_per_record": round((last["bytes"] - first["bytes"]) / written, 1)
        if written
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", default="250000,1000000")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", help="the Spark driver's heap (session's default)")
    parser.add_argument("--live", action="store_true", help="the archiver under queue load")
    parser.add_argument("--senders", type=int, default=64)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--receivers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--roll-age-s", type=float, default=10)
    args = parser.parse_args()
    if args.live:
        report.emit(live(args))
        return
    from relay_spark import jobs
    from relay_spark.session import session

    started = time.monotonic()
    spark = session(args.master, driver_memory=args.driver_memory)
    summary: dict[str, object] = {"spark_session_s": round(time.monotonic() - started, 2)}
    for size in (int(n) for n in args.commands.split(",")):
        work = Path(tempfile.mkdtemp(prefix="archive-bench-"))
        try:
            store = LocalStore(work / "archive")
            t = time.monotonic()
            made = synthetic.make(store, commands=size, partitions=args.partitions, per_file=50_000)
            generated_s = time.monotonic() - t
            size_bytes = sum(p.stat().st_size for p in (work / "archive").rglob("*.parquet"))
            cut = tables.Cut(synthetic.EPOCH, 1_700_000_000_000 + 86_400_000, made.commands)
            t = time.monotonic()
            python_counts = jobs.rebuild_python(store, cut, work / "python")
            python_s = time.monotonic() - t
            t = time.monotonic()
            spark_counts = jobs.rebuild(spark, store, cut, work / "spark")
            spark_s = time.monotonic() - t
            assert python_counts == spark_counts, (python_counts, spark_counts)
            summary[f"{size}_records"] = 2 * size
            summary[f"{size}_bytes_per_record"] = round(size_bytes / (2 * size), 1)
            summary[f"{size}_generate_s"] = round(generated_s, 1)
            summary[f"{size}_python_s"] = round(python_s, 2)
            summary[f"{size}_spark_s"] = round(spark_s, 2)
            summary[f"{size}_messages_rebuilt"] = python_counts["messages"]
        finally:
            shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    report.emit(summary)


if __name__ == "__main__":
    main()
