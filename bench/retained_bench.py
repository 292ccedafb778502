"""Retained-message store benchmark (issue 8).

    .venv/bin/python bench/retained_bench.py [--topics 1000000] [--payload 256] [--page-size 100]
        [--batch 1] [--no-mosquitto]

(`bench/setup-peers.sh` first, once: it installs the Mosquitto broker this runs beside Relay.)

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

Then, unless `--no-mosquitto`, the same topics and payload are retained in a Mosquitto broker
(`bench/setup-peers.sh` installs Debian's `mosquitto`; without it the run stops before it
starts) bound to 127.0.0.1 on a free port, persistence on in a temp dir, its default autosave
(Mosquitto does not fsync each retained message, so its store rate is not a durable rate):
- `mosquitto_store_per_s`: one MQTT 3.1.1 connection publishes them (QoS 0, pipelined; the time
  ends at the PINGRESP that follows the last one);
- `mosquitto_match_all_s`: a second client subscribes to `#`, until every retained message
  arrived (over TCP, parsed in Python: not like for like with the in-process `match_all_s`);
- `mosquitto_rss_mb`: the broker's resident memory after that. Relay's figure,
  `match_all_peak_rss_mb`, is this whole benchmark process (which computes topic names from
  their index rather than holding a list of them);
- `mosquitto_stop_s`: SIGTERM until the broker exited, having written its database file
  (`mosquitto_db_bytes_per_topic`, beside `disk_bytes_per_topic`);
- `mosquitto_restart_s`: starting it again on that file until it accepted a connection and a
  subscriber to the first topic stored got its retained message (the database is loaded), to
  set beside `restart_s` (which includes closing the store); `mosquitto_restart_all_s`: from the
  same start until a `#` subscriber got every retained message again (checks the file held
  them all);
- `match_all_ratio_vs_mosquitto`, `rss_ratio_vs_mosquitto`, `restart_ratio_vs_mosquitto`:
  Relay's `match_all_s`, `match_all_peak_rss_mb`, `restart_s` / Mosquitto's;
- `mosquitto_version`: `mosquitto -h`'s.
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import overload

import report

from relay_streams.retained import RetainedStore, Write

PAGE = 10_000


class Names(Sequence[str]):
    """The workload's topics in a shuffled order, each computed from its index (an affine
    permutation of 0..n-1), so the process holds no list of a million names and its RSS is the
    store's own."""

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n = n
        self.a = 1
        if n > 2:
            while True:
                self.a = rng.randrange(2, n)
                if math.gcd(self.a, n) == 1:
                    break
        self.b = rng.randrange(n) if n else 0

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        k = (self.a * (i % self.n) + self.b) % self.n
        return f"t{k % 100:02}/dev/d{k // 100:05}"


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


READ_TIMEOUT_S = 120  # a broker silent this long has lost what it was expected to send


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _packet(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + _varint(len(body)) + body


def _string(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


class MqttClient:
    """Just enough MQTT 3.1.1 for the benchmark: connect, retained QoS 0 publishes, ping,
    subscribe, and counting the PUBLISH packets that arrive."""

    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.buffer = bytearray()
        try:
            # protocol "MQTT" level 4, clean session, keep-alive off
            self.sock.sendall(
                _packet(0x10, _string("MQTT") + b"\x04\x02\x00\x00" + _string(client_id))
            )
            kind, _body = self.read_packet()
        except BaseException:
            self.sock.close()
            raise
        assert kind == 0x20, hex(kind)

    def read_packet(self) -> tuple[int, bytes]:
        while True:
            packet = self._parse()
            if packet is not None:
                return packet
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buffer += chunk

    def _parse(self) -> tuple[int, bytes] | None:
        buf = self.buffer
        length, shift, i = 0, 0, 1
        while True:
            if i >= len(buf):
                return None
            length |= (buf[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not buf[i - 1] & 0x80:
                break
        if len(buf) < i + length:
            return None
        kind, body = buf[0] & 0xF0, bytes(buf[i : i + length])
        del buf[: i + length]
        return kind, body

    def publish_retained(self, names: Sequence[str], payload: bytes) -> None:
        chunk = []
        for name in names:
            chunk.append(_packet(0x31, _string(name) + payload))
            if len(chunk) == 1000:
                self.sock.sendall(b"".join(chunk))
                chunk = []
        self.sock.sendall(b"".join(chunk))
        self.sock.sendall(b"\xc0\x00")  # PINGREQ: answered after every publish before it
        while self.read_packet()[0] != 0xD0:
            pass

    def subscribe_count(self, topic_filter: str, expected: int) -> int:
        self.sock.sendall(_packet(0x82, b"\x00\x01" + _string(topic_filter) + b"\x00"))
        seen = 0
        while seen < expected:
            kind, _body = self.read_packet()
            seen += kind == 0x30
        return seen

    def close(self) -> None:
        self.sock.sendall(b"\xe0\x00")  # DISCONNECT
        self.sock.close()


SBIN = "/usr/sbin:/usr/local/sbin"  # Debian's mosquitto is /usr/sbin/mosquitto, off users' PATH
STARTUP_S = 600  # the longest a broker may take to start (it loads its whole database first)


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or shutil.which("mosquitto", path=SBIN)


def mosquitto_version(binary: str) -> str:
    """`mosquitto -h` prints "mosquitto version 2.0.11" first (and exits 3)."""
    out = subprocess.run([binary, "-h"], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else ""
    return first.removeprefix("mosquitto version ").strip()


class Mosquitto:
    """One broker process on a config file, its output in a log beside it."""

    def __init__(self, binary: str, conf: Path, port: int) -> None:
        self.port = port
        self.log = conf.with_suffix(".log")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )

    def connect(self, client_id: str) -> MqttClient:
        """The first client to get a CONNACK, once the broker listens."""
        deadline = time.monotonic() + STARTUP_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited {self.process.returncode}: {self.tail()}")
            try:
                return MqttClient(self.port, client_id)
            except ConnectionError:  # refused until it listens
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
        return kb / 1024

    def stop(self) -> None:
        """SIGTERM, on which Mosquitto writes its database file before it exits."""
        self.process.terminate()
        self.process.wait(timeout=STARTUP_S)
        if self.process.returncode != 0 or "Error" in self.log.read_text(errors="replace"):
            raise RuntimeError(f"mosquitto stopped with {self.process.returncode}: {self.tail()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return " | ".join(lines[-5:])


def mosquitto_side(
    binary: str, names: Sequence[str], payload: bytes, folder: Path
) -> dict[str, float]:
    """The same retained set in a Mosquitto broker, stopped and started again (module
    docstring). Its seconds, unrounded."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder.mkdir()
    conf = folder / "mosquitto.conf"
    # As root, Mosquitto otherwise switches to the `mosquitto` user, which cannot write into this
    # root-owned 0700 temp dir: it would run, then fail to save its database.
    user = "user root\n" if os.geteuid() == 0 else ""
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {folder}/\nretain_available true\nmax_queued_messages 0\n"
        f"max_queued_bytes 0\n{user}"
    )
    db = folder / "mosquitto.db"
    broker = Mosquitto(binary, conf, port)
    try:
        publisher = broker.connect("bench-pub")
        t0 = time.perf_counter()
        publisher.publish_retained(names, payload)
        store_s = time.perf_counter() - t0
        publisher.close()
        subscriber = broker.connect("bench-sub")
        t0 = time.perf_counter()
        seen = subscriber.subscribe_count("#", len(names))
        match_s = time.perf_counter() - t0
        assert seen == len(names), seen
        subscriber.close()
        rss = broker.rss_mb()

        t0 = time.perf_counter()
        broker.stop()
        stop_s = time.perf_counter() - t0
        assert db.is_file(), broker.tail()
        db_bytes = db.stat().st_size

        t0 = time.perf_counter()
        broker = Mosquitto(binary, conf, port)
        probe_client = broker.connect("bench-restart")
        probe_client.subscribe_count(names[0], 1)
        restart_s = time.perf_counter() - t0
        probe_client.close()
        subscriber = broker.connect("bench-sub-again")
        seen = subscriber.subscribe_count("#", len(names))
        restart_all_s = time.perf_counter() - t0
        assert seen == len(names), seen
        subscriber.close()
        broker.stop()
    finally:
        broker.kill()
    return {
        "store_per_s": len(names) / store_s,
        "match_all_s": match_s,
        "rss_mb": rss,
        "stop_s": stop_s,
        "db_bytes_per_topic": db_bytes / len(names),
        "restart_s": restart_s,
        "restart_all_s": restart_all_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1, help="writes per store_many call")
    parser.add_argument("--no-mosquitto", action="store_true", help="measure Relay alone")
    parser.add_argument("--dir", type=Path, default=None, help="parent folder (default: tmp)")
    args = parser.parse_args()
    binary = None
    if not args.no_mosquitto:
        binary = mosquitto_binary()
        if binary is None:
            sys.exit(
                "retained_bench: no mosquitto binary (PATH, /usr/sbin): run bench/setup-peers.sh"
                " (or pass --no-mosquitto)"
            )
    # SIGTERM unwinds like Ctrl-C, so the finally clauses stop the broker and remove the files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    root = Path(tempfile.mkdtemp(prefix="retained-bench-", dir=args.dir))
    path = root / "retained"
    rng = random.Random(7)  # noqa: S311 - a fixed workload, not a secret
    names = Names(args.topics, rng)
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
        peer = mosquitto_side(binary, names, payload, root / "mosquitto") if binary else None
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mosquitto: dict[str, object] = {}
    if peer is not None:
        assert binary is not None
        mosquitto = {
            "mosquitto_version": mosquitto_version(binary),
            "mosquitto_store_per_s": round(peer["store_per_s"]),
            "mosquitto_match_all_s": round(peer["match_all_s"], 3),
            "mosquitto_rss_mb": round(peer["rss_mb"], 1),
            "mosquitto_stop_s": round(peer["stop_s"], 3),
            "mosquitto_db_bytes_per_topic": round(peer["db_bytes_per_topic"]),
            "mosquitto_restart_s": round(peer["restart_s"], 3),
            "mosquitto_restart_all_s": round(peer["restart_all_s"], 3),
            "match_all_ratio_vs_mosquitto": round(reads["match_all_s"] / peer["match_all_s"], 3),
            "rss_ratio_vs_mosquitto": round(reads["match_all_peak_rss_mb"] / peer["rss_mb"], 3),
            "restart_ratio_vs_mosquitto": round(restart_s / peer["restart_s"], 3),
        }
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
            **mosquitto,
        }
    )


if __name__ == "__main__":
    main()
