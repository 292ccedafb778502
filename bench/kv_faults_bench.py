"""Replicated key-value under faults (issue 21): a killed replica, divergence after a pause,
anti-entropy at rest, restart with a million keys. Relay alone (the peers' equivalents are not
comparable: etcd and Redis have no per-key anti-entropy).

    .venv/bin/python bench/kv_faults_bench.py
        options (defaults): --keys 20000 --clients 16 --kill-seconds 15 --divergent 100000
        --rest-seconds 30 --restart-keys 1000000 --value-bytes 256 --join-before-s 5
        --skip kill|diverge|rest|restart|join (repeatable)

One suite, `relayctl up --replicators 3` in a temp data dir, a namespace with n=3, r=2, w=2
(`kv_bench.Relay`), `--keys` keys written once; then, in order:
- kill: `--clients` tasks write random keys for `--kill-seconds`; a third of the way in, one
  replicator is killed (SIGKILL; `relayctl` restarts it at once: its first exit in a minute).
  Figures: writes/s before the kill, the time from the kill until a one-second window reaches
  70 % of that rate (`resume_s`), the rate from 2 s after the kill to the end as a fraction of
  the rate before (`after_ratio`), the longest write, errors. Target (issue 21): resume within
  2 s at 70 % or more.
- diverge: one replicator is paused (SIGSTOP) while `--divergent` new keys are written (each
  retried until acknowledged by W=2), then resumed (SIGCONT); figures: the divergent shards
  right after the heal and the time until `relayctl kv divergence`'s report (every pair's
  tictac hashes, every n) is empty. Target: 100k divergent keys converge within 60 s.
- rest: with nothing written, once every replicator finished two anti-entropy passes since its
  start (`rest_settle_s` after the phase began: the first computes each peer's group hashes),
  each replicator's CPU time over `--rest-seconds` as a share of one core
  (`rest_cpu_percent`); then the suite is restarted with anti-entropy off
  (`RELAY_KV__SYNC_INTERVAL_S=0`) and measured the same way, as long after its start
  (`rest_cpu_percent_without_sync`: what every idle service pays, Kafka heartbeats and
  fetch polls, the bus keeper, hint hand-off checks), and restarted again as it was.
  `rest_sync_cpu_percent` is the difference of the two means: anti-entropy's own cost.
  Target: anti-entropy at rest at most 1 %.
- restart: the suite stops; every replicator's store is filled offline through its engine
  (`KvStore.merge`, the same envelopes on each, so nothing diverges) up to `--restart-keys`
  keys; the suite starts again and settles (two anti-entropy passes, as before the rest
  figures), one replicator is killed, and the time from its restart to a 200 from its
  `/readyz` is measured, with the same figure before the fill for comparison.
  Target: ready within 2 s at 1M keys. Then the rest figures again, with the filled stores
  (`filled_rest_cpu_percent*`).
- join: a fourth replicator is started (the environment of the first, its own port and data
  dir, a peer list naming all four): it adopts the three-site view. `--clients` tasks write
  random keys for `--join-before-s`, then the admin asks for it (`relayctl ds join kv SITE`:
  `PUT /ds/storages/kv/replicas/{site}`) and the writes go on until `GET /ds/storages/kv`
  shows the new view with no change, and 3 s more. Figures: the time from the request to that
  (`join_s`), writes/s before, during and after the change (and during/before), errors, the
  keys the new site pulled (`relay_kv_sync_keys_total{way="pulled"}`).
The last line is the JSON summary (`bench/report.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import kv_bench
import report

from relay_kv import crdt, hints, placement
from relay_kv.clock import Version
from relay_replicator.store import KvStore, Write
from relayctl import state
from relayctl.kv_commands import divergence_report

NAMESPACE = "bench"
N = 3


def replicators(data_dir: Path) -> list[state.ChildState]:
    suite = state.read_state(data_dir)
    if suite is None:
        raise RuntimeError(f"no suite runs on {data_dir}")
    return sorted(
        (c for c in suite.children if c.name.startswith("relay-replicator-")),
        key=lambda c: c.name,
    )


def replicator_urls(data_dir: Path) -> list[str]:
    return [c.probe_url.removesuffix("/readyz") for c in replicators(data_dir) if c.probe_url]


def pid_of(data_dir: Path, name: str) -> int:
    for child in replicators(data_dir):
        if child.name == name and child.pid:
            return child.pid
    raise RuntimeError(f"{name} has no pid in the run state")


def restarted(data_dir: Path, name: str, old_pid: int, deadline_s: float = 60) -> float:
    """Seconds from `name` running under a new pid to a 200 from its /readyz."""
    limit = time.monotonic() + deadline_s
    while True:
        child = next(c for c in replicators(data_dir) if c.name == name)
        if child.pid and child.pid != old_pid and child.probe_url:
            break
        if time.monotonic() > limit:
            raise RuntimeError(f"{name} was not restarted within {deadline_s} s")
        time.sleep(0.005)
    started = time.monotonic()
    with httpx.Client(timeout=1) as http:
        while time.monotonic() < limit:
            try:
                if http.get(child.probe_url).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise RuntimeError(f"{name} was not ready again within {deadline_s} s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def write_for(
    relay: kv_bench.Relay, keys: list[str], clients: int, seconds: float, value: bytes, at: Any
) -> tuple[list[tuple[float, bool]], float]:
    """Random writes for `seconds`; `at(t0)` is awaited once a third of the way in."""
    await relay.open(clients)
    done: list[tuple[float, bool]] = []
    longest = 0.0
    began = time.monotonic()
    stop = began + seconds

    async def worker(w: int) -> None:
        nonlocal longest
        rng = random.Random(w)  # noqa: S311 - a workload, not a secret
        while time.monotonic() < stop:
            started = time.monotonic()
            try:
                ok = await relay.write(w, rng.choice(keys), value)
            except kv_bench.CLIENT_ERRORS:
                ok = False
            finished = time.monotonic()
            longest = max(longest, finished - started)
            done.append((finished - began, ok))

    async def fault() -> None:
        await asyncio.sleep(seconds / 3)
        await at()

    await asyncio.gather(fault(), *(worker(w) for w in range(clients)))
    await relay.close()
    return done, longest


def kill_phase(
    relay: kv_bench.Relay, keys: list[str], options: Any, value: bytes
) -> dict[str, Any]:
    name = replicators(relay.data_dir)[1].name
    killed_at = 0.0

    async def kill() -> None:
        nonlocal killed_at
        killed_at = time.monotonic()
        os.kill(pid_of(relay.data_dir, name), signal.SIGKILL)

    began = time.monotonic()
    done, longest = asyncio.run(
        write_for(relay, keys, options.clients, options.kill_seconds, value, kill)
    )
    kill_t = killed_at - began
    ok_times = sorted(t for t, ok in done if ok)
    before = [t for t in ok_times if 1.0 <= t < kill_t]
    rate_before = len(before) / max(kill_t - 1.0, 1e-9)
    resume_s = None
    step = 0.05
    t = kill_t
    while t + 1.0 <= options.kill_seconds:
        window = sum(1 for x in ok_times if t <= x < t + 1.0)
        if window >= 0.7 * rate_before:
            resume_s = round(t + 1.0 - kill_t, 2)
            break
        t += step
    after = [x for x in ok_times if x >= kill_t + 2.0]
    after_span = options.kill_seconds - (kill_t + 2.0)
    return {
        "kill_writes_per_s_before": round(rate_before),
        "kill_resume_s": resume_s,
        "kill_after_ratio": round(len(after) / after_span / rate_before, 3)
        if after_span > 0 and rate_before
        else None,
        "kill_longest_write_s": round(longest, 2),
        "kill_errors": sum(1 for _, ok in done if not ok),
    }


async def write_all(relay: kv_bench.Relay, keys: list[str], clients: int, value: bytes) -> int:
    """Write every key once, retrying each until acknowledged; the number of retries."""
    await relay.open(clients)
    queue = list(reversed(keys))
    retries = 0

    async def worker(w: int) -> None:
        nonlocal retries
        while queue:
            key = queue.pop()
            while True:
                try:
                    if await relay.write(w, key, value):
                        break
                except kv_bench.CLIENT_ERRORS:
                    pass
                retries += 1
                await asyncio.sleep(0.05)

    await asyncio.gather(*(worker(w) for w in range(clients)))
    await relay.close()
    return retries


def divergent_shards(relay: kv_bench.Relay) -> int:
    report_rows = divergence_report(replicator_urls(relay.data_dir), relay.admin)
    return sum(len(shards) for _, _, _, shards in report_rows)


def diverge_phase(relay: kv_bench.Relay, options: Any, value: bytes) -> dict[str, Any]:
    name = replicators(relay.data_dir)[2].name
    pid = pid_of(relay.data_dir, name)
    keys = [f"div-{i}" for i in range(options.divergent)]
    os.kill(pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        retries = asyncio.run(write_all(relay, keys, max(options.clients, 64), value))
    finally:
        os.kill(pid, signal.SIGCONT)
    written_s = time.monotonic() - began
    healed = time.monotonic()
    at_heal = divergent_shards(relay)
    converged_s = None
    while time.monotonic() - healed < options.converge_limit_s:
        if divergent_shards(relay) == 0:
            converged_s = round(time.monotonic() - healed, 1)
            break
        time.sleep(1.0)
    return {
        "diverge_keys": len(keys),
        "diverge_write_s": round(written_s, 1),
        "diverge_retries": retries,
        "diverge_shards_at_heal": at_heal,
        "diverge_converged_s": converged_s,
    }


def settled(data_dir: Path, deadline_s: float = 120) -> float:
    """Seconds until every replicator finished two anti-entropy passes since it started (the
    first after a start computes each peer's group hashes once; the steady state is what
    "at rest" means)."""
    began = time.monotonic()
    for url in replicator_urls(data_dir):
        while httpx.get(f"{url}/internal/kv/status", timeout=5).json()["sync_passes"] < 2:
            if time.monotonic() - began > deadline_s:
                raise RuntimeError(f"{url}: no two anti-entropy passes in {deadline_s} s")
            time.sleep(0.5)
    return round(time.monotonic() - began, 1)


def rest_phase(relay: kv_bench.Relay, options: Any) -> dict[str, Any]:
    """The replicators' CPU at rest, then the same with anti-entropy off (the suite restarted
    with `RELAY_KV__SYNC_INTERVAL_S=0`, measured as long after its start): the difference is
    what anti-entropy itself costs; the rest is what any idle service pays (Kafka group
    heartbeats, fetch long-polls, the bus keeper, hint hand-off checks)."""
    settle_s = settled(relay.data_dir)
    shares = rest_shares(relay.data_dir, options.rest_seconds)
    relay.stop()
    relay.start(env={"RELAY_KV__SYNC_INTERVAL_S": "0"})
    try:
        wait_all_ready(relay.data_dir)
        time.sleep(settle_s)
        without = rest_shares(relay.data_dir, options.rest_seconds)
    finally:
        relay.stop()
        relay.start()
        wait_all_ready(relay.data_dir)
    mean = sum(shares.values()) / len(shares)
    mean_without = sum(without.values()) / len(without)
    return {
        "rest_settle_s": settle_s,
        "rest_cpu_percent_max": max(shares.values()),
        "rest_cpu_percent": shares,
        "rest_cpu_percent_without_sync": without,
        "rest_sync_cpu_percent": round(mean - mean_without, 2),
    }


def rest_shares(data_dir: Path, seconds: float) -> dict[str, float]:
    """Each replicator's CPU time over `seconds`, as a percentage of one core."""
    pids = {c.name: c.pid for c in replicators(data_dir) if c.pid}
    first = {name: cpu_seconds(pid) for name, pid in pids.items()}
    began = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - began
    return {
        name: round(100 * (cpu_seconds(pid) - first[name]) / elapsed, 2)
        for name, pid in pids.items()
    }


def restart_once(data_dir: Path) -> float:
    """Kill the first replicator; seconds from its restart (a new pid) until it is ready."""
    name = replicators(data_dir)[0].name
    old = pid_of(data_dir, name)
    os.kill(old, signal.SIGKILL)
    return round(restarted(data_dir, name, old), 2)


async def fill(path: Path, keys: int, value: bytes, wall_ms: int) -> None:
    store = KvStore(path, hints.HintLimits())
    store.open()
    try:
        version = Version(wall_ms, 0, "F" * 16)
        chunk = 20_000
        for start in range(0, keys, chunk):
            writes = [
                Write(
                    N,
                    placement.shard_of(NAMESPACE, key),
                    NAMESPACE,
                    key,
                    crdt.Register(version, value),
                )
                for key in (f"fill-{i}" for i in range(start, min(keys, start + chunk)))
            ]
            await store.merge(writes)
    finally:
        await store.close()


def restart_phase(relay: kv_bench.Relay, options: Any, value: bytes) -> dict[str, Any]:
    data_dir = relay.data_dir
    before = restart_once(data_dir)
    relay.stop()
    stores = sorted(data_dir.glob("**/kv/db"))
    wall_ms = int(time.time() * 1000)
    began = time.monotonic()
    for path in stores:
        asyncio.run(fill(path, options.restart_keys, value, wall_ms))
    filled_s = time.monotonic() - began
    relay.start()
    # As the small store's figure: in a running cluster, not in the suite's own start, when
    # every replicator computes its peers' group hashes over the million keys at once.
    settled(data_dir)
    after = restart_once(data_dir)
    wait_all_ready(data_dir)
    at_rest = rest_phase(relay, options)
    return {
        "restart_keys": options.restart_keys,
        "restart_fill_s_per_store": round(filled_s / max(len(stores), 1), 1),
        "restart_ready_s_small": before,
        "restart_ready_s_filled": after,
        **{f"filled_{name}": figure for name, figure in at_rest.items()},
    }


def start_joining(relay: kv_bench.Relay) -> tuple[subprocess.Popen[bytes], str]:
    """A fourth replicator, configured as the suite's first but for its instance, port, data
    dir and peers (every replicator, itself included); once ready."""
    first = replicators(relay.data_dir)[0]
    assert first.pid is not None
    raw = Path(f"/proc/{first.pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    port = kv_bench.free_port()
    url = f"http://{env.get('RELAY_HTTP__HOST', '127.0.0.1')}:{port}"
    env.update(
        RELAY_INSTANCE="replicator-joining",
        RELAY_HTTP__PORT=str(port),
        RELAY_DATA__DIR=str(relay.data_dir / "replicator-joining"),
        RELAY_KV__PEERS=json.dumps([*replicator_urls(relay.data_dir), url]),
    )
    with (relay.data_dir / "logs" / "replicator-joining.log").open("ab") as out:
        process = subprocess.Popen(
            [str(kv_bench.VENV_BIN / "relay-replicator")], env=env, stdout=out, stderr=out
        )
    with httpx.Client(timeout=1) as http:
        for _ in range(600):
            try:
                if http.get(f"{url}/readyz").status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the joining replicator never got ready")


async def join_run(
    relay: kv_bench.Relay, keys: list[str], options: Any, value: bytes, joining: str
) -> dict[str, Any]:
    await relay.open(options.clients)
    admin = httpx.AsyncClient(
        base_url=relay.url, headers={"Authorization": f"Bearer {relay.admin}"}, timeout=30
    )
    done: list[tuple[float, bool]] = []
    relay.failures.clear()
    began = time.monotonic()
    stop = asyncio.Event()

    async def worker(w: int) -> None:
        rng = random.Random(w)  # noqa: S311 - a workload, not a secret
        while not stop.is_set():
            try:
                ok = await relay.write(w, rng.choice(keys), value)
            except kv_bench.CLIENT_ERRORS as error:
                relay.failures[type(error).__name__] += 1
                ok = False
            done.append((time.monotonic() - began, ok))

    async def change() -> tuple[float, float, dict[str, Any]]:
        await asyncio.sleep(options.join_before_s)
        site = (await admin.get(f"{joining}/internal/kv/site")).json()["site"]
        shown = (await admin.get("/ds/storages/kv")).json()
        asked = time.monotonic() - began
        joined = await asyncio.create_subprocess_exec(
            str(kv_bench.VENV_BIN / "relayctl"),
            *("ds", "join", "kv", site, "--data-dir", str(relay.data_dir)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        printed, _ = await joined.communicate()
        if joined.returncode != 0:
            raise RuntimeError(f"relayctl ds join kv refused: {printed.decode()}")
        while True:
            now = (await admin.get("/ds/storages/kv")).json()
            if now["version"] > shown["version"] and "change" not in now:
                ended = time.monotonic() - began
                await asyncio.sleep(3)
                stop.set()
                return asked, ended, now
            await asyncio.sleep(0.1)

    (asked, ended, now), *_ = await asyncio.gather(
        change(), *(worker(w) for w in range(options.clients))
    )
    end = time.monotonic() - began
    await relay.close()
    metrics = (await admin.get(f"{joining}/metrics")).text
    status = (await admin.get(f"{joining}/internal/kv/status")).json()
    await admin.aclose()
    pulled = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('relay_kv_sync_keys_total{way="pulled"}')
    )

    def rate(start: float, stop_t: float) -> float:
        return sum(1 for t, ok in done if ok and start <= t < stop_t) / max(stop_t - start, 1e-9)

    before, during, after = rate(1.0, asked), rate(asked, ended), rate(ended, end)
    return {
        "join_s": round(ended - asked, 2),
        "join_writes_per_s_before": round(before),
        "join_writes_per_s_during": round(during),
        "join_writes_per_s_after": round(after),
        "join_during_ratio": round(during / before, 3) if before else None,
        "join_errors": sum(1 for _, ok in done if not ok),
        "join_error_kinds": dict(relay.failures),
        "join_keys_pulled": int(pulled),
        "join_view_version": now["version"],
        "join_view_sites": len(now["sites"]),
        "join_new_site_sees_sites": len(status["sites"]),
    }


def join_phase(
    relay: kv_bench.Relay, keys: list[str], options: Any, value: bytes
) -> dict[str, Any]:
    process, url = start_joining(relay)
    try:
        return asyncio.run(join_run(relay, keys, options, value, url))
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--kill-seconds", type=float, default=15)
    parser.add_argument("--divergent", type=int, default=100_000)
    parser.add_argument("--converge-limit-s", type=float, default=300)
    parser.add_argument("--rest-seconds", type=float, default=30)
    parser.add_argument("--restart-keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument("--join-before-s", type=float, default=5)
    parser.add_argument("--work", type=Path, help="keep the suite's data and logs here")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["kill", "diverge", "rest", "restart", "join"],
    )
    options = parser.parse_args()
    value = os.urandom(options.value_bytes)
    keys = [f"key-{i}" for i in range(options.keys)]
    summary: dict[str, Any] = {"keys": options.keys, "clients": options.clients}
    (kv_bench.ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=kv_bench.ROOT / "var", prefix="kv-faults-") as temp:
        relay = kv_bench.Relay(options.work or Path(temp))
        try:
            asyncio.run(kv_bench.preload(relay, keys, value))
            if "kill" not in options.skip:
                summary.update(kill_phase(relay, keys, options, value))
                wait_all_ready(relay.data_dir)
            if "diverge" not in options.skip:
                summary.update(diverge_phase(relay, options, value))
            if "rest" not in options.skip:
                summary.update(rest_phase(relay, options))
            if "restart" not in options.skip:
                summary.update(restart_phase(relay, options, value))
            if "join" not in options.skip:  # last: the others expect three replicators
                wait_all_ready(relay.data_dir)
                summary.update(join_phase(relay, keys, options, value))
        finally:
            relay.stop()
    report.emit(summary)


def wait_all_ready(data_dir: Path) -> None:
    with httpx.Client(timeout=1) as http:
        for _ in range(600):
            try:
                if all(
                    c.probe_url and http.get(c.probe_url).status_code == 200
                    for c in replicators(data_dir)
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise RuntimeError("replicators not ready")


if __name__ == "__main__":
    main()
