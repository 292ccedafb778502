"""Durable stream store benchmark (issue 7).

    .venv/bin/python bench/streams_bench.py [--messages 1000000] [--topics 100000] [--batch 1000]

Workload: `--messages` messages of `--payload` (256) random bytes over `--topics` topics shaped
`t<tenant>/dev/<device>` (100 tenants, topics/100 devices each), written round-robin over the
topics in a shuffled order, into one database with the default settings (4 shards, `lts/1`
with thresholds 100 then 20, so each shard learns `t<n>/dev/+` plus the first 20 devices of
each tenant as their own streams). Each `store_batch` call carries `--batch` messages with
timestamps assigned by the store, and is durable (`sync=True`: WAL fsynced) when it returns.

Measures, in one run:
- `store_msgs_per_s`: messages / time spent inside `store_batch` (one writer), with the
  call latency p50/p90/p99/max (the average is not reported);
- `replay_msgs_per_s`: `get_streams("#")`, then every stream read to its end with `next(1000)`;
- `wildcard_replay_ms`: the same for `t07/#` (1% of the topics, 1% of the messages), which LTS
  maps to that tenant's streams only;
- `varying_replay_ms`: `+/dev/d00042` (0.1% of the topics), a filter on a level LTS turned
  into `+`: its streams are scanned whole and each topic is matched (the layout's weak case);
- `disk_bytes_per_msg`: every file of the database after its memtables are flushed / messages;
- `reopen_s`: closing and opening the store again.
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import report

from relay_streams.database import Database
from relay_streams.store import StreamStore


def replay(db: Database, topic_filter: str) -> tuple[int, float, int]:
    """(messages, seconds, streams) of reading every stream of the filter to its end."""
    started = time.perf_counter()
    ranked = db.get_streams(topic_filter)
    count = 0
    for r in ranked:
        iterator = db.make_iterator(r.stream, topic_filter)
        while True:
            result = db.next(iterator, 1000)
            count += len(result.messages)
            iterator = result.iterator
            if result.end_of_stream or not result.messages:
                break
    return count, time.perf_counter() - started, len(ranked)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    tenants = 100
    devices = max(1, args.topics // tenants)
    topics = [f"t{t:02d}/dev/d{d:05d}" for t in range(tenants) for d in range(devices)]
    random.Random(42).shuffle(topics)  # noqa: S311 - a fixed workload, not a secret

    Path("var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="streams-bench-", dir="var"))
    try:
        store = StreamStore(work, node="bench")
        db = store.open_db("bench")
        latencies = []
        sent = 0
        while sent < args.messages:
            size = min(args.batch, args.messages - sent)
            blob = os.urandom(size * args.payload)
            batch = [
                (topics[(sent + i) % len(topics)], blob[i * args.payload : (i + 1) * args.payload])
                for i in range(size)
            ]
            started = time.perf_counter()
            db.store_batch(batch, sync=True)
            latencies.append(time.perf_counter() - started)
            sent += size
        store_s = sum(latencies)
        disk = db.disk_bytes(flush=True)

        replayed, replay_s, all_streams = replay(db, "#")
        assert replayed == args.messages, (replayed, args.messages)
        wild, wild_s, wild_streams = replay(db, "t07/#")
        varying, varying_s, varying_streams = replay(db, "+/dev/d00042")
        store.close()
        started = time.perf_counter()
        store = StreamStore(work, node="bench")
        store.open_db("bench")
        reopen_s = time.perf_counter() - started
        store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    ms = [x * 1000 for x in latencies]
    summary = {
        "benchmark": "streams",
        "messages": args.messages,
        "topics": len(topics),
        "payload_bytes": args.payload,
        "batch": args.batch,
        "store_msgs_per_s": round(args.messages / store_s),
        "store_batch_ms_p50": round(percentile(ms, 50), 2),
        "store_batch_ms_p90": round(percentile(ms, 90), 2),
        "store_batch_ms_p99": round(percentile(ms, 99), 2),
        "store_batch_ms_max": round(max(ms), 2),
        "replay_msgs_per_s": round(replayed / replay_s),
        "replay_streams": all_streams,
        "wildcard_replay_ms": round(wild_s * 1000, 1),
        "wildcard_messages": wild,
        "wildcard_streams": wild_streams,
        "varying_replay_ms": round(varying_s * 1000, 1),
        "varying_messages": varying,
        "varying_streams": varying_streams,
        "disk_bytes_per_msg": round(disk / args.messages, 1),
        "reopen_s": round(reopen_s, 2),
    }
    report.emit(summary)


if __name__ == "__main__":
    main()
