"""Queue journal benchmark (issue 4).

    .venv/bin/python bench/journal_bench.py [--queues 100] [--seconds 5] [--idle-queues 100000]
    .venv/bin/python bench/journal_bench.py --queues 100,10000,100000 --seconds 5 --idle-queues 0

Measures, in one run on this machine:
- `raw_group_commit_per_s`: this disk's group-commit limit from Python: 256-byte os.write
  appends to one file with fdatasync every 100 appends;
- `durable_appends_per_s`: journal writes of 256-byte bodies under FsyncPolicy.ALWAYS (each
  write returns once durable) from `--queues` concurrently written queues (one asyncio writer
  task per queue), and `ratio` = durable / raw. `--queues` may list several counts: each is
  measured in turn in the same run (a fresh journal each), and `by_queues` gives each one's
  figures with `vs_first`, its durable appends/s over the first count's (issue 18: 10,000 and
  100,000 queues within 2x of 100), and `rss_mb` (the process's growth while that many queues
  are open and written);
- latency percentiles of those durable writes, `writes_per_fsync` (how many shared each
  fdatasync round), and `sync_backend` (where the fdatasyncs ran: `uring`, `aio` or `thread`,
  see `relay_durable.kernel_sync`);
- `durable_batched_appends_per_s` and `ratio_batched`: the queue-writer's own pattern, one
  write per queue applied, then one wait for durability (the next batch is applied meanwhile);
- `deliver_ack_per_s`: peek + ack (durable) of what was written, same concurrency;
- `rss_mb_100k_idle_queues`: resident-memory growth of a fresh process after creating
  `--idle-queues` queues with 3 messages each and closing the idle ones;
- `open_s_100k`: time to open the journal holding them, in a fresh process;
- `fdatasync_append_us` and `fdatasync_over_spare_us`: median fdatasync of a round's worth of
  records (50 x 330 bytes) appended to a file, and written over a synced zero-filled one (what
  the journal's spares give its segments, decision 0004);
- `load_avg_1m`: the machine's 1-minute load average before and after (the figures are CPU-bound:
  a loaded machine lowers them).
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import report

from relay_journal.aio import AsyncJournal
from relay_journal.journal import QueueJournal
from relay_journal.settings import FsyncPolicy, JournalSettings

BODY = b"x" * 256
_ids = iter(range(1, 1 << 62))


def next_msg_id() -> bytes:
    """Message ids are opaque to the journal; a counter keeps id generation out of the figures."""
    return next(_ids).to_bytes(24, "big")


def queue_id() -> str:
    return secrets.token_urlsafe(24)


def raw_group_commit(folder: Path, seconds: float) -> float:
    path = folder / "raw.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    n, deadline = 0, time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(100):
            os.write(fd, BODY)
        os.fdatasync(fd)
        n += 100
    elapsed = time.perf_counter() - started
    os.close(fd)
    path.unlink()
    return n / elapsed


def fdatasync_us(folder: Path, *, over_spare: bool, rounds: int = 1000) -> float:
    path = folder / "sync.log"
    chunk = b"r" * (50 * 330)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if over_spare:
        os.write(fd, bytes(rounds * len(chunk)))
        os.fdatasync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    took = []
    for _ in range(rounds):
        os.write(fd, chunk)
        started = time.perf_counter()
        os.fdatasync(fd)
        took.append(time.perf_counter() - started)
    os.close(fd)
    path.unlink()
    return statistics.median(took) * 1e6


async def batched_appends(
    journal: AsyncJournal, ids: list[str], seconds: float
) -> tuple[int, float]:
    """The queue-writer's own pattern: a batch of commands (one per queue) applied, then one
    wait for durability; the next batch is applied while that fsync runs."""
    batched = 0
    stop = time.perf_counter() + seconds
    started = time.perf_counter()
    pending: asyncio.Task[None] | None = None
    while time.perf_counter() < stop:
        lsn = 0
        for qid in ids:
            lsn = journal.journal.write(qid, next_msg_id(), BODY, ts_ms=1)
        batched += len(ids)
        if pending is not None:
            await pending
        pending = asyncio.ensure_future(journal.durable(lsn))
    if pending is not None:
        await pending
    return batched, time.perf_counter() - started


async def durable_appends(
    root: Path, queues: int, seconds: float, backends: tuple[str, ...]
) -> dict[str, Any]:
    journal = AsyncJournal(
        JournalSettings(
            root=root,
            max_queue_messages=10**6 - 1,
            max_file_messages=10**6,
            fsync_backends=backends,
        )
    )
    await journal.start()
    rss_before = psutil.Process().memory_info().rss
    ids = [queue_id() for _ in range(queues)]
    for qid in ids:  # the queues exist before the timed part: creating folders is not appending
        journal.journal.write(qid, next_msg_id(), BODY, ts_ms=1)
    await journal.durable(journal.journal.wal.written_lsn)
    # And their state lines are written: the setup's checkpoint (one state line per queue
    # created) is not charged to the timed part. Checkpoints of what the timed part writes
    # (one per 64 MiB of log) are.
    journal.journal.checkpoint()
    latencies: list[float] = []
    go = asyncio.Event()
    stop = 0.0

    async def writer(qid: str) -> int:
        # Every writer starts at `go`: creating 100,000 tasks takes seconds of its own.
        await go.wait()
        # One clock read per write: it ends this write's latency and starts the next one's.
        count = 0
        now = time.perf_counter()
        while now < stop:
            await journal.write(qid, next_msg_id(), BODY, ts_ms=1)
            latency = time.perf_counter() - now
            now += latency
            latencies.append(latency)
            count += 1
        return count

    tasks = [asyncio.ensure_future(writer(q)) for q in ids]
    await asyncio.sleep(0)  # every writer waits at `go`
    rounds = journal.commit.rounds
    started = time.perf_counter()
    stop = started + seconds
    go.set()
    written = sum(await asyncio.gather(*tasks))
    elapsed = time.perf_counter() - started
    rounds = journal.commit.rounds - rounds
    rss_mb = (psutil.Process().memory_info().rss - rss_before) / 2**20
    handles = journal.journal.handles
    handles_released = handles.released

    batched, batch_elapsed = await batched_appends(journal, ids, seconds)

    async def drainer(qid: str) -> int:
        count = 0
        while (message := journal.peek(qid)) is not None:
            await journal.ack(qid, message.msg_id)
            count += 1
        return count

    started = time.perf_counter()
    delivered = sum(await asyncio.gather(*(drainer(q) for q in ids)))
    drain_elapsed = time.perf_counter() - started
    backend = journal.commit.backend
    await journal.close()
    latencies.sort()
    return {
        "durable_appends_per_s": written / elapsed,
        "durable_batched_appends_per_s": batched / batch_elapsed,
        "append_p50_ms": latencies[len(latencies) // 2] * 1000,
        "append_p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "deliver_ack_per_s": delivered / drain_elapsed,
        "written": written,
        "writes_per_fsync": written / max(rounds, 1),
        "sync_backend": backend,
        "rss_mb": rss_mb,
        "handles_released": handles_released,
    }


def idle_child(root: str, count: int) -> None:
    """Run in a fresh process: create `count` queues x 3 messages, close idle, report RSS."""
    process = psutil.Process()
    settings = JournalSettings(root=Path(root), fsync=FsyncPolicy.NEVER, max_open_queues=1000)
    before = process.memory_info().rss
    journal = QueueJournal(settings)
    started = time.perf_counter()
    for _ in range(count):
        qid = queue_id()
        for _ in range(3):
            journal.write(qid, secrets.token_bytes(24), BODY, ts_ms=int(time.time() * 1000))
    journal.close_idle(0)
    create_s = time.perf_counter() - started
    after = process.memory_info().rss
    journal.close()
    print(
        json.dumps(
            {
                "rss_mb": (after - before) / 2**20,
                "create_s": create_s,
                "open_queues": journal.open_queues,
            }
        )
    )


def open_child(root: str) -> None:
    started = time.perf_counter()
    journal = QueueJournal(JournalSettings(root=Path(root)))
    opened = time.perf_counter() - started
    journal.close()
    print(json.dumps({"open_s": opened}))


def run_child(*args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--queues", default="100", help="concurrently written queues; a comma list runs each"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--idle-queues", type=int, default=100_000)
    parser.add_argument(
        "--sync",
        default="uring,aio",
        help="fdatasync backends to try in order (relay_durable.kernel_sync); 'thread' for none."
        " Kubernetes' default seccomp profile refuses io_uring: 'aio' is what a pod gets there",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir under ./var)"
    )
    parser.add_argument("--child-idle", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-open", nargs=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_idle:
        idle_child(args.child_idle[0], int(args.child_idle[1]))
        return
    if args.child_open:
        open_child(args.child_open[0])
        return

    load_before = os.getloadavg()[0]  # other work on the machine skews every figure
    base = args.dir or Path("var")
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="journal-bench-", dir=base))
    try:
        raws = [raw_group_commit(work, args.seconds / 2) for _ in range(2)]
        raw = statistics.median(raws)
        backends = tuple(b for b in args.sync.split(",") if b and b != "thread")
        counts = [int(n) for n in args.queues.split(",")]
        runs = []
        for n, count in enumerate(counts):
            runs.append(
                asyncio.run(durable_appends(work / f"durable-{n}", count, args.seconds, backends))
            )
            shutil.rmtree(work / f"durable-{n}", ignore_errors=True)
        durable = runs[0]
        raw_after = raw_group_commit(work, args.seconds / 2)
        sync_append = fdatasync_us(work, over_spare=False)
        sync_over_spare = fdatasync_us(work, over_spare=True)
        raw = statistics.median([*raws, raw_after])
        idle = {"rss_mb": None, "create_s": None}
        opened = {"open_s": None}
        if args.idle_queues:
            idle = run_child("--child-idle", str(work / "idle"), str(args.idle_queues))
            opened = run_child("--child-open", str(work / "idle"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    summary: dict[str, Any] = {
        "benchmark": "journal",
        "queues": counts[0],
        "body_bytes": len(BODY),
        "raw_group_commit_per_s": round(raw),
        "durable_appends_per_s": round(durable["durable_appends_per_s"]),
        "ratio": round(durable["durable_appends_per_s"] / raw, 3),
        "durable_batched_appends_per_s": round(durable["durable_batched_appends_per_s"]),
        "ratio_batched": round(durable["durable_batched_appends_per_s"] / raw, 3),
        "append_p50_ms": round(durable["append_p50_ms"], 3),
        "append_p99_ms": round(durable["append_p99_ms"], 3),
        "writes_per_fsync": round(durable["writes_per_fsync"], 1),
        "sync_backend": durable["sync_backend"],
        "deliver_ack_per_s": round(durable["deliver_ack_per_s"]),
        "fdatasync_append_us": round(sync_append),
        "fdatasync_over_spare_us": round(sync_over_spare),
        "idle_queues": args.idle_queues,
        "rss_mb_100k_idle_queues": idle["rss_mb"] and round(idle["rss_mb"], 1),
        "create_s_idle_queues": idle["create_s"] and round(idle["create_s"], 1),
        "open_s_100k": opened["open_s"] and round(opened["open_s"], 3),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if len(counts) > 1:
        first = durable["durable_appends_per_s"]
        summary["by_queues"] = [
            {
                "queues": count,
                "durable_appends_per_s": round(run["durable_appends_per_s"]),
                "ratio": round(run["durable_appends_per_s"] / raw, 3),
                "vs_first": round(run["durable_appends_per_s"] / first, 3),
                "durable_batched_appends_per_s": round(run["durable_batched_appends_per_s"]),
                "ratio_batched": round(run["durable_batched_appends_per_s"] / raw, 3),
                "append_p99_ms": round(run["append_p99_ms"], 3),
                "writes_per_fsync": round(run["writes_per_fsync"], 1),
                "deliver_ack_per_s": round(run["deliver_ack_per_s"]),
                "rss_mb": round(run["rss_mb"], 1),
                "handles_released": run["handles_released"],
            }
            for count, run in zip(counts, runs, strict=True)
        ]
    report.emit(summary)


if __name__ == "__main__":
    main()
