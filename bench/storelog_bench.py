"""Queue store log benchmark (issues 5 and 18).

    .venv/bin/python bench/storelog_bench.py [--queues 1000000] [--writers 100] [--seconds 5]
        [--messages-per-queue 3]

Measures, in one run: `log_records_per_s`, durable `new` records per second under
FsyncPolicy.ALWAYS from `--writers` concurrent asyncio writers (shared fsync rounds);
then, holding `--queues` queue records: `dump_pause_ms` (how long changes waited: steps 1-4),
`dump_total_s` (all eight steps), `dump_bytes`, and `restore_s` (a fresh process opening the
store log: version 2 dumps are read in place, so this no longer grows with the queues);
`restore_v1_s` (the same records as a version 1 dump, read whole; skipped with
`--no-v1`). Then `restart_s` (`restart_s_1m_queues` at the full size): a queue-writer's data
dir of `--queues` queues holding `--messages-per-queue` messages each, from the start of a
fresh process to its stores open (readiness `stores`) and one SEND and one SUB served for
queues picked at random, with `restart_rss_mb` (that process's resident memory then) and
`restart_in_memory` (queue records it had decoded into memory: 0 means none was loaded).
Kafka is not started: connecting to it does not depend on the number of queues. The data dir
takes a while to write at full size (1M queue folders, 3M messages; several minutes here).
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import report
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from relay_durable.policy import FsyncPolicy
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import ids
from relay_storelog import records
from relay_storelog.aio import AsyncStoreLog
from relay_storelog.records import QueueRecord
from relay_storelog.store import StoreLog, StoreLogSettings

KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUBLIC = ids.b64u(KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
NOW = 1_700_000_000_000


def record(i: int) -> QueueRecord:
    return QueueRecord(f"r{i:031d}", f"s{i:031d}", PUBLIC, 128, NOW, NOW)


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


def journal_child(root: str, queues: int, per_queue: int) -> None:
    """Write `per_queue` messages to each of `queues` queues (the store's recipient ids)."""
    journal = QueueJournal(
        JournalSettings(root=Path(root), fsync=FsyncPolicy.NEVER, max_open_queues=1000)
    )
    body = b"m" * 256
    n = 0
    for i in range(queues):
        queue = record(i).recipient_id
        for _ in range(per_queue):
            n += 1
            journal.write(queue, n.to_bytes(24, "big"), body, ts_ms=NOW)
    journal.close()
    print(json.dumps({"messages": n}))


def restart_child(data_dir: str, queues: int) -> None:
    """A queue-writer's start: its stores opened as the service opens them, then one SEND and
    one SUB to queues picked at random (not touched since the start)."""
    from relay_queue_writer.stores import Stores
    from relay_queues.delivery import Subscriber
    from relay_queues.writer import QueueRules, Signed
    from relay_runtime.readiness import Readiness

    async def run() -> dict[str, object]:
        readiness = Readiness()
        stores = Stores(Path(data_dir), readiness, 0, repair=False)
        await stores.open()
        assert readiness.ready
        assert stores.journal is not None
        assert stores.store is not None
        store = stores.store.store
        rules = QueueRules(stores.journal.journal, store, default_ttl_s=10**9)
        picked = record(secrets.randbelow(queues))
        sent = rules.send(ids.SenderId(picked.sender_id), ids.new_id(), b"x", None, NOW)
        assert sent.status == 201, sent
        text = "GET\n/x\n1\n-"
        signed = Signed(text, KEY.sign(text.encode()))
        other = ids.QueueId(record(secrets.randbelow(queues)).recipient_id)
        subscribed = rules.subscribe(other, signed, Subscriber(0, "c"), NOW)
        assert subscribed.status == 200, subscribed
        assert subscribed.events
        assert subscribed.events[0].head is not None  # its messages
        result = {
            "rss_mb": psutil.Process().memory_info().rss / 2**20,
            "in_memory": store.in_memory,
            "queues": len(store.queues),
        }
        await stores.close()
        return result

    result = asyncio.run(run())
    print(json.dumps(result), flush=True)


def run_json(*args: str) -> dict[str, Any]:
    """Run this script as a child; its answer is the last stdout line starting with `{`."""
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    answer = [line for line in out.stdout.splitlines() if line.startswith("{")][-1]
    result: dict[str, Any] = json.loads(answer)
    return result


def at_scale(work: Path, queues: int, per_queue: int, *, v1: bool) -> dict[str, Any]:
    """Fill a store with `queues` records, dump it, time the restores; then write a journal of
    `per_queue` messages for each and time a queue-writer's start over that data dir."""
    data_dir = work / "queue-writer"
    store_dir = data_dir / "store"
    store = StoreLog(StoreLogSettings(root=store_dir, fsync=FsyncPolicy.NEVER))
    started = time.perf_counter()
    for i in range(queues):
        store.new(record(i))
    fill_s = time.perf_counter() - started
    store.file.sync_to(store.file.written)  # steady state under ALWAYS: the log is durable
    store.dump()
    result = store.wait_dump()
    assert result is not None
    store.close()
    restored = run_json("--child-restore", str(store_dir))
    assert restored["records"] == queues
    figures: dict[str, Any] = {
        "fill_s": round(fill_s, 1),
        "dump_pause_ms": round(result.pause_ms, 3),
        "dump_total_s": round(result.total_s, 2),
        "dump_bytes": result.bytes,
        "restore_s": round(restored["restore_s"], 3),
        "restore_v1_s": None,
        "restart_s": None,
        "restart_rss_mb": None,
        "restart_in_memory": None,
    }
    if v1:
        old = work / "v1"
        old.mkdir()
        with (old / "store-0.dump").open("wb") as f:  # what version 1 wrote
            for i in range(queues):
                f.write(records.encode("new", records.queue_to_data(record(i))))
        figures["restore_v1_s"] = round(run_json("--child-restore", str(old))["restore_s"], 2)
        shutil.rmtree(old)
    if per_queue:
        built = time.perf_counter()
        run_json("--child-journal", str(data_dir / "journal"), str(queues), str(per_queue))
        print(f"data dir written in {time.perf_counter() - built:.0f} s", file=sys.stderr)
        subprocess.run(["sync"], check=False)
        started = time.perf_counter()
        restart = run_json("--child-restart", str(data_dir), str(queues))
        figures["restart_s"] = round(time.perf_counter() - started, 2)
        figures["restart_rss_mb"] = round(restart["rss_mb"], 1)
        figures["restart_in_memory"] = restart["in_memory"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", "--records", dest="queues", type=int, default=1_000_000)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--messages-per-queue", type=int, default=3, help="0 skips the restart")
    parser.add_argument("--no-v1", action="store_true", help="skip the version 1 restore")
    parser.add_argument("--child-restore", help=argparse.SUPPRESS)
    parser.add_argument("--child-journal", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--child-restart", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_restore:
        restore_child(args.child_restore)
        return
    if args.child_journal:
        journal_child(args.child_journal[0], int(args.child_journal[1]), int(args.child_journal[2]))
        return
    if args.child_restart:
        restart_child(args.child_restart[0], int(args.child_restart[1]))
        return
    Path("var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="storelog-bench-", dir="var"))
    try:
        rate = asyncio.run(durable_rate(work / "rate", args.writers, args.seconds))
        figures = at_scale(work, args.queues, args.messages_per_queue, v1=not args.no_v1)
        restart_s = figures["restart_s"]
        summary = {
            "benchmark": "storelog",
            "queues": args.queues,
            "log_records_per_s": round(rate),
            "writers": args.writers,
            **figures,
            "restart_s_1m_queues": restart_s if args.queues == 1_000_000 else None,
            "messages_per_queue": args.messages_per_queue,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        report.emit(summary)  # before the clean-up: removing 1M queue folders takes minutes
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
