"""What one set operation costs as the set grows (issue 21: "sets as add-wins with dots per
element row"; decision 0011, "Sets as rows").

    .venv/bin/python bench/kv_sets_bench.py [--sizes 1000,10000,30000] [--ops 100]

Three real replicators in process (`tests/kv/inprocess.py`: real sockets, real RocksDB stores,
n = 3, r = w = 2), their coordinators called directly (no Kafka, no ingress: the replicas' share
alone). One set is grown to each size in adds of 500 members, then at each size `--ops`
single-member adds, `--ops` single-member removes and `--ops` first pages of 100 members are
timed one after the other (an operation that fails, INDETERMINATE when a replica's write
outlasts the replica timeout, counts in `errors`, its time in the mean). Run it from a
checkout of another commit to compare (`cd OTHER && .venv/bin/python
/path/to/bench/kv_sets_bench.py`: the replicators are that checkout's). The last line is a
JSON summary: per size, the mean ms of each operation and the errors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report

from relay_durable.codec import b64u
from relay_kv import names

sys.path.insert(0, str(Path.cwd()))  # this checkout's tests, or another's to compare

from tests.kv.inprocess import replicators, request


async def run(sizes: list[int], ops: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        async with replicators(Path(root), {"A": 0, "B": 0, "C": 0}) as coordinators:
            a = coordinators["A"]
            made = await a.run(request(op="ns_put", ns="bench", admin=True, n=3))
            assert made.data is not None
            auth = {"ns": "bench", "key": "s", "token_sha256": names.token_hash(made.data["token"])}

            errors: list[str] = []

            async def timed(**fields: Any) -> float:
                started = time.perf_counter()
                outcome = await a.run(request(**auth, **fields))
                if not outcome.ok:
                    errors.append(str(outcome.code))
                return time.perf_counter() - started

            def mean_ms(times: list[float]) -> float:
                return round(1000 * sum(times) / len(times), 2)

            grown = 0
            for size in sizes:
                while grown < size:
                    batch = [b64u(b"member-%09d" % i) for i in range(grown, min(size, grown + 500))]
                    await timed(op="members", add=tuple(batch))
                    grown += len(batch)
                errors.clear()
                extra = [b64u(b"extra-%09d" % i) for i in range(ops)]
                add = [await timed(op="members", add=(m,)) for m in extra]
                remove = [await timed(op="members", remove=(m,)) for m in extra]
                page = [await timed(op="list_members", limit=100) for _ in range(ops)]
                results[str(size)] = {
                    "add_ms": mean_ms(add),
                    "remove_ms": mean_ms(remove),
                    "first_page_ms": mean_ms(page),
                    "errors": len(errors),
                }
                print(f"{size:>8} members: {results[str(size)]} {sorted(set(errors))}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,30000")
    parser.add_argument("--ops", type=int, default=100)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = asyncio.run(run(sizes, args.ops))
    summary: dict[str, Any] = {"ops": args.ops}
    for size, figures in results.items():
        summary.update({f"{name}_{size}": value for name, value in figures.items()})
    report.emit(summary)


if __name__ == "__main__":
    main()
