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
summary. Not measured here: the archiver's own throughput and lag under `queues_bench` load.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.spark import synthetic  # noqa: E402

from relay_archive import tables  # noqa: E402
from relay_archive.store import LocalStore  # noqa: E402
from relay_spark import jobs  # noqa: E402
from relay_spark.session import session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commands", default="250000,1000000")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    started = time.monotonic()
    spark = session(args.master)
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
