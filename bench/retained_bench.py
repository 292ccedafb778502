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

With `--mosquitto` (Debian's `mosquitto` installed: `apt-get install mosquitto`), the same
topics and payload are then retained in a Mosquitto broker (persistence on, its default
autosave: Mosquitto does not fsync each retained message, so its store rate is not a durable
rate) over one MQTT 3.1.1 connection (QoS 0 publishes, pipelined; the time ends at the
PINGRESP that follows the last one): `mosquitto_store_per_s`; then a second client subscribes
to `#` and `mosquitto_match_all_s` is the time until every retained message arrived;
`mosquitto_rss_mb` is the broker's resident memory after that.
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
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
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buffer = bytearray()
        # protocol "MQTT" level 4, clean session, keep-alive off
        self.sock.sendall(_packet(0x10, _string("MQTT") + b"\x04\x02\x00\x00" + _string(client_id)))
        kind, _body = self.read_packet()
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

    def publish_retained(self, names: list[str], payload: bytes) -> None:
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


def mosquitto_side(names: list[str], payload: bytes, folder: Path) -> dict[str, float]:
    """The same retained set in a Mosquitto broker (module docstring)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder.mkdir()
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {folder}/\nretain_available true\nmax_queued_messages 0\n"
        "max_queued_bytes 0\n"
    )
    broker = subprocess.Popen(
        ["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.05)
        publisher = MqttClient(port, "bench-pub")
        t0 = time.perf_counter()
        publisher.publish_retained(names, payload)
        store_s = time.perf_counter() - t0
        publisher.close()
        subscriber = MqttClient(port, "bench-sub")
        t0 = time.perf_counter()
        seen = subscriber.subscribe_count("#", len(names))
        match_s = time.perf_counter() - t0
        assert seen == len(names), seen
        subscriber.close()
        with open(f"/proc/{broker.pid}/status") as f:
            rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    finally:
        broker.terminate()
        broker.wait(timeout=60)
    return {
        "mosquitto_store_per_s": round(len(names) / store_s),
        "mosquitto_match_all_s": round(match_s, 3),
        "mosquitto_rss_mb": round(rss_kb / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1, help="writes per store_many call")
    parser.add_argument("--mosquitto", action="store_true", help="also measure Mosquitto")
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
        mosquitto = mosquitto_side(names, payload, root / "mosquitto") if args.mosquitto else {}
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
            **mosquitto,
        }
    )


if __name__ == "__main__":
    main()
