"""Jepsen-style, in pytest: four clients add and remove set members and write one register
through the ingress while a nemesis cuts replica pairs, pauses a replicator (SIGSTOP) and kills
one (SIGKILL, then restarts it on its volume); one replicator's clock runs 3 s behind the
others. Then everything heals, every pair's hashes must agree, and the history is checked:
- no acknowledged add is lost (unless a remove of it was attempted afterwards);
- no member appears that no client tried to add;
- a member removed (acknowledged) after its last acknowledged add stays removed;
- each client's quorum reads of the register never go back to an older version;
- register versions follow the real-time order of acknowledged writes: a write that started
  after another was acknowledged has the greater version (the lagging clock must not win).
  Whether the lagging site coordinates a register write right after a faster one depends on
  the partitions Kafka hands it, so this check may pass without the clock rule being needed;
  `test_clock_skew.py` is the deterministic proof (it fails without the resend).

`RELAY_NEMESIS_S` sets the length of the faulty period (default 20 s).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from relay_durable.codec import unb64u
from tests import helpers
from tests.kv import cluster as kvc
from tests.kv.test_replication import FAST, divergence, eventually

CLIENTS = 4


@dataclass
class History:
    acked_adds: dict[bytes, float] = field(default_factory=dict)
    """member -> when its add was acknowledged (monotonic)."""
    attempted: set[bytes] = field(default_factory=set)
    removes: dict[bytes, tuple[float, bool]] = field(default_factory=dict)
    """member -> (when the remove started, acknowledged?)."""
    writes: list[tuple[float, float, str]] = field(default_factory=list)
    """Acknowledged register writes: (start, end, version)."""
    reads: dict[int, list[str]] = field(default_factory=dict)
    """Per client, the register versions its successful reads returned, in order."""
    outcomes: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, status: int) -> None:
        with self.lock:
            self.outcomes[status] = self.outcomes.get(status, 0) + 1


def client_loop(url: str, token: str, me: int, stop: threading.Event, history: History) -> None:
    client = kvc.Client(url, token, timeout_s=15)
    rng = random.Random(me)
    mine: list[bytes] = []
    j = 0
    while not stop.is_set():
        j += 1
        choice = rng.random()
        try:
            if choice < 0.5 or not mine:
                member = f"c{me}-{j}".encode()
                with history.lock:
                    history.attempted.add(member)
                response = client.members("nemesis", "set", add=[member])
                if response.status_code == 200:
                    with history.lock:
                        history.acked_adds[member] = time.monotonic()
                    mine.append(member)
            elif choice < 0.65:
                member = mine.pop(rng.randrange(len(mine)))
                started = time.monotonic()
                with history.lock:
                    history.removes[member] = (started, False)
                response = client.members("nemesis", "set", remove=[member])
                if response.status_code == 200:
                    with history.lock:
                        history.removes[member] = (started, True)
            elif choice < 0.75:
                response = client.get("nemesis", "register")
                if response.status_code == 200:
                    with history.lock:
                        history.reads.setdefault(me, []).append(response.json()["version"])
            else:
                started = time.monotonic()
                response = client.put("nemesis", "register", f"c{me}-{j}".encode())
                if response.status_code == 200:
                    with history.lock:
                        history.writes.append(
                            (started, time.monotonic(), response.json()["version"])
                        )
            history.count(response.status_code)
        except httpx.HTTPError:
            history.count(0)


def nemesis(running: kvc.Cluster, stop: threading.Event, log: list[str]) -> None:
    rng = random.Random(7)
    names = list(running.names)
    while not stop.is_set():
        action = rng.choice(["cut", "pause", "kill"])
        victim = rng.choice(names)
        if action == "cut":
            other = rng.choice([n for n in names if n != victim])
            running.cut(victim, other)
            log.append(f"cut {victim}-{other}")
            stop.wait(2)
            running.cut(victim, other, cut=False)
        elif action == "pause":
            running.signal(victim, signal.SIGSTOP)
            log.append(f"pause {victim}")
            stop.wait(2)
            running.signal(victim, signal.SIGCONT)
        else:
            running.kill(victim)
            log.append(f"kill {victim}")
            stop.wait(1)
            running.restart(victim)
        stop.wait(1)


def test_no_acknowledged_write_is_lost_under_a_nemesis(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    with kvc.cluster(tmp_path, kafka, redis_url, **FAST) as running:
        # One site's clock 3 s behind: its stamps alone would lose to older writes.
        running.replicator_env["D"] = {"RELAY_KV__CLOCK_OFFSET_MS": "-3000"}
        running.kill("D")
        running.restart("D")
        admin = kvc.Client(running.ingress_url)
        made = admin.namespace("nemesis", n=3, r=2, w=2, gc_grace_s=3600)
        assert made.status_code == 200, made.text
        token = made.json()["token"]

        history = History()
        stop, done = threading.Event(), threading.Event()
        faults: list[str] = []
        clients = [
            threading.Thread(
                target=client_loop, args=(running.ingress_url, token, i, done, history)
            )
            for i in range(CLIENTS)
        ]
        chaos = threading.Thread(target=nemesis, args=(running, stop, faults))
        for thread in [*clients, chaos]:
            thread.start()
        time.sleep(float(os.environ.get("RELAY_NEMESIS_S", "20")))
        stop.set()
        chaos.join()
        for name in running.names:  # heal: every link, every process running
            running.isolate(name, cut=False)
            running.signal(name, signal.SIGCONT)
        time.sleep(3)
        done.set()
        for thread in clients:
            thread.join()

        eventually(lambda: divergence(running) == {}, budget=60, what="hashes agree after heal")
        client = kvc.Client(running.ingress_url, token)
        listed = client.list_members("nemesis", "set", limit=1000, r=3)
        assert listed.status_code == 200, listed.text
        members = {unb64u(m) for m in listed.json()["members"]}
        assert listed.json()["cursor"] is None

        print(f"faults: {faults}; outcomes: {history.outcomes}; members: {len(members)}")
        assert faults, "the nemesis did nothing"
        assert len(history.acked_adds) > 20, history.outcomes
        assert members <= history.attempted, members - history.attempted
        lost = {m for m in history.acked_adds if m not in history.removes and m not in members}
        assert not lost, f"acknowledged adds lost: {sorted(lost)}"
        resurrected = {
            m
            for m, (started, acked) in history.removes.items()
            if acked and started > history.acked_adds.get(m, 0) and m in members
        }
        assert not resurrected, f"removed members back: {sorted(resurrected)}"
        out_of_order = [
            (a, b)
            for a in history.writes
            for b in history.writes
            if a[1] < b[0] and not a[2] < b[2]
        ]
        assert not out_of_order, out_of_order[:5]
        backwards = {
            client: versions
            for client, versions in history.reads.items()
            if versions != sorted(versions)
        }
        assert not backwards, f"a client's quorum reads went back: {backwards}"
        assert sum(len(v) for v in history.reads.values()) > 5
        assert len(history.writes) > 5
