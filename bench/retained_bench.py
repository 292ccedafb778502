"""Retained-message store benchmark (issue 8).

    .venv/bin/python bench/retained_bench.py [--topics 1000000] [--payload 256] [--page-size 100]
        [--batch 1]

Workload: `--topics` topics shaped `t<tenant>/dev/d<device>` (100 tenants, topics/100 devices
each), each retained once with the same `--payload` random bytes (so compression flatters
`disk_bytes_per_topic`), in a shuffled order, by one writer
calling `RetainedStore.store` (`--batch 1`: every call is its own synced write batch, durable
when it returns) or `store_many` with `--batch` writes (one synced batch for them all, the
service's group commit), into a fresh store with the default settings.

Measures, in one run:
- `store_per_s`: topics / time spent inside `store` (or `store_many`), with the call latency
  p50/p99/max in ms
  (the average is not reported);
- `match_all_s`: the `#` iterator read to its end; `match_all_peak_rss_mb` is the process RSS
  sampled every 10,000 messages while it runs (it streams: the peak stays where it started,
  `rss_before_match_mb`);
- `match_device_ms`: `+/dev/d00042` (one topic per tenant), which the store answers with one
  seek per tenant instead of a scan;
- `page_1_ms` and `page_10000_ms`: `page("#", limit=--page-size)` for the first page and for
  page 10,000 (its cursor taken from the `#` pass: the last topic of page 9,999), each the
  median of 20 reads; page 10,000 exists only when topics >= 10,000 x page size, otherwise the
  last page is measured and `page_n` says which;
- `restart_s`: closing and opening the store again (and reading `size`).
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

from relay_streams.retained import RetainedStore, Write

PAGE = 10_000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_reads(store: RetainedStore, topics: int, page_size: int) -> dict[str, float]:
    """The `#` stream, the `+/dev/...` match and pages 1 and 10,000."""
    rss_before = rss_mb()
    peak = rss_before
    cursors: list[str] = []  # every page_size-th topic: the last topic of each page
    t0 = time.perf_counter()
    seen = 0
    for message in store.match("#"):
        seen += 1
        if seen % page_size == 0 and len(cursors) < PAGE:
            cursors.append(message.topic)
        if seen % 10_000 == 0:
            peak = max(peak, rss_mb())
    match_all_s = time.perf_counter() - t0
    assert seen == topics, seen

    t0 = time.perf_counter()
    device = list(store.match(f"+/dev/d{min(42, max(1, topics // 100) - 1):05}"))
    match_device_ms = (time.perf_counter() - t0) * 1000
    assert len(device) == min(100, topics), len(device)

    def page_ms(after: str | None) -> float:
        times = []
        for _ in range(20):
            t = time.perf_counter()
            page, _next = store.page("#", after=after, limit=page_size)
            times.append(time.perf_counter() - t)
            assert page
        return statistics.median(times) * 1000

    page_1 = page_ms(None)
    before_n = min(PAGE, len(cursors))  # page n starts after the last topic of page n - 1
    if before_n * page_size >= topics:
        before_n -= 1
    page_last = page_ms(cursors[before_n - 1]) if before_n >= 1 else page_1
    return {
        "match_all_s": round(match_all_s, 3),
        "rss_before_match_mb": round(rss_before, 1),
        "match_all_peak_rss_mb": round(peak, 1),
        "match_device_ms": round(match_device_ms, 3),
        "page_size": page_size,
        "page_1_ms": round(page_1, 3),
        "page_n": before_n + 1,
        "page_10000_ms": round(page_last, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1, help="writes per store_many call")
    parser.add_argument("--dir", type=Path, default=None, help="parent folder (default: tmp)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="retained-bench-", dir=args.dir))
    path = root / "retained"
    rng = random.Random(7)  # noqa: S311 - a fixed workload, not a secret
    names = [f"t{i % 100:02}/dev/d{i // 100:05}" for i in range(args.topics)]
    rng.shuffle(names)
    payload = rng.randbytes(args.payload)
    try:
        store = RetainedStore(path)
        latencies: list[float] = []
        for i in range(0, len(names), args.batch):
            writes = [Write(name, payload) for name in names[i : i + args.batch]]
            t0 = time.perf_counter()
            if args.batch == 1:
                store.store(writes[0].topic, payload)
            else:
                store.store_many(writes)
            latencies.append(time.perf_counter() - t0)
        store_s = sum(latencies)
        assert store.size() == args.topics
        reads = measure_reads(store, args.topics, args.page_size)

        t0 = time.perf_counter()
        store.close()
        store = RetainedStore(path)
        size = store.size()
        restart_s = time.perf_counter() - t0
        assert size == args.topics
        store.close()
        disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    report.emit(
        {
            "bench": "retained",
            "topics": args.topics,
            "payload_bytes": args.payload,
            "batch": args.batch,
            "store_per_s": round(args.topics / store_s),
            "store_p50_ms": round(percentile(latencies, 0.5) * 1000, 3),
            "store_p99_ms": round(percentile(latencies, 0.99) * 1000, 3),
            "store_max_ms": round(max(latencies) * 1000, 3),
            **reads,
            "restart_s": round(restart_s, 3),
            "disk_bytes_per_topic": round(disk / args.topics),
        }
    )


if __name__ == "__main__":
    main()
