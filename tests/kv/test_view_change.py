"""Membership changes of the replicators while clients write and read: a third replicator joins a
two-site cluster, then an original one leaves, each started by the admin through the ingress
(`PUT /ds/storages/kv/replicas`, `DELETE /ds/storages/kv/replicas/{site}`); a replicator
SIGKILLed in the middle of a change resumes it from `members.json`, and one started meanwhile
adopts the change and takes part before it coordinates; bad bodies are answered 400 (or 409
during a change) and change nothing.

Real processes: Kafka, replicators, an ingress; no anti-entropy (only the change's own
mechanisms move data). The namespace has n=2, w=2, so every acknowledged write is on both home
replicas of its key. Clients read with r=1 or r=2. Checks: no acknowledged write is lost (a read
never answers less than the highest value acknowledged before it started); a client's r=2 reads
(both replicas, blocking read repair) never go back; once the change finished (the load stops
then) every acknowledged write, including keys written only before the change, is held by each
of its key's new home replicas.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from relay_durable.codec import unb64u
from relay_kv import placement
from tests import helpers
from tests.kv import cluster as kvc
from tests.kv.test_replication import FAST, eventually, value_of

NS = "app"
KEYS = 30
QUIET = {**FAST, "RELAY_KV__SYNC_INTERVAL_S": "0"}
"""No anti-entropy: a new home replica gets data only by the change's pull, dual writes and
read repair, which are what is tested."""


class Load:
    """Writers each counting up over keys of their own; readers checking what they read."""

    def __init__(
        self, url: str, token: str, base: int = 0, writers: int = 2, readers: int = 2
    ) -> None:
        self.url, self.token, self.base = url, token, base
        """Values start above `base` (a later load's writes are newer than an earlier's)."""
        self.acked: dict[str, int] = {}
        """key -> the highest value acknowledged (a writer's values only grow)."""
        self.lock = threading.Lock()
        self.violations: list[str] = []
        self.answers: Counter[str] = Counter()
        self.stop = threading.Event()
        self.keys = [f"w{t}-{k}" for t in range(writers) for k in range(KEYS)]
        self.threads = [
            threading.Thread(target=self._write, args=(t,), daemon=True) for t in range(writers)
        ] + [threading.Thread(target=self._read, args=(t,), daemon=True) for t in range(readers)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _client(self) -> kvc.Client:
        return kvc.Client(self.url, self.token, timeout_s=30)

    def _write(self, writer: int) -> None:
        client, i = self._client(), self.base
        while not self.stop.is_set():
            i += 1
            key = f"w{writer}-{i % KEYS}"
            try:
                answer = client.put(NS, key, str(i).encode())
            except httpx.HTTPError:
                continue
            self.answers[f"put {answer.status_code}"] += 1
            if answer.status_code == 200:
                with self.lock:
                    self.acked[key] = max(self.acked.get(key, 0), i)

    def _read(self, reader: int) -> None:
        client, seen = self._client(), dict[str, int]()
        chooser = random.Random(reader)
        while not self.stop.is_set():
            key = chooser.choice(self.keys)
            with self.lock:
                floor = self.acked.get(key, 0)
            r = chooser.choice((1, 2))
            try:
                answer = client.get(NS, key, r=r)
            except httpx.HTTPError:
                continue
            self.answers[f"get {answer.status_code}"] += 1
            if answer.status_code == 200:
                value = int(unb64u(answer.json()["value"]))
            elif answer.status_code == 404:
                value = 0
            else:
                continue
            if value < floor:
                self.violations.append(f"{key}: read {value} after {floor} was acknowledged")
            if r == 1:  # one replica: it may lack a write in flight, not an acknowledged one
                continue
            if value < seen.get(key, 0):
                self.violations.append(f"{key}: read {value} after reading {seen[key]}")
            seen[key] = max(seen.get(key, 0), value)


def admin(running: kvc.Cluster, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(
        method,
        f"{running.ingress_url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {kvc.TOKEN}"},
        timeout=30,
    )


def storage(running: kvc.Cluster) -> dict[str, Any]:
    answer = admin(running, "GET", "/ds/storages/kv")
    assert answer.status_code == 200, answer.text
    shown: dict[str, Any] = answer.json()
    return shown


def finished(
    running: kvc.Cluster, version: int, sites: list[str], dead: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """The storage once every replicator (but the `dead` ones) runs the view `version` of
    `sites` (None before)."""
    shown = storage(running)
    if shown["version"] != version or "change" in shown or shown["sites"] != sorted(sites):
        return None
    for name, replicator in running.replicators.items():
        if name in dead:
            continue
        status = replicator.get("/internal/kv/status")
        if status["version"] != version or status["change"] is not None:
            return None
    return shown


def members_file(replicator: kvc.Replicator) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((replicator.data_dir / "kv" / "members.json").read_text())
    return found


def check_held(running: kvc.Cluster, load: Load, sites: list[str]) -> None:
    """Every acknowledged write is on each home replica of its key in the view of `sites`."""
    by_site = {r.site: r for r in running.replicators.values()}
    for key, value in sorted(load.acked.items()):
        shard = placement.shard_of(NS, key)
        for site in placement.replicas(shard, sites, 2).home:
            raw = value_of(by_site[site].local_value(2, NS, key))
            held = 0 if raw is None else int(raw)
            assert held >= value, f"{key} on {by_site[site].name}: {held} < {value}"


def check_reads(client: kvc.Client, load: Load) -> None:
    for key, value in sorted(load.acked.items()):
        got = client.get(NS, key, r=2)
        assert got.status_code == 200, got.text
        assert int(unb64u(got.json()["value"])) >= value, key


def start(running: kvc.Cluster) -> kvc.Client:
    client = kvc.Client(running.ingress_url)
    made = client.namespace(NS, n=2, r=1, w=2)
    assert made.status_code == 200, made.text
    client.token = made.json()["token"]
    return client


def cold(client: kvc.Client, prefix: str, count: int = 60) -> Load:
    """Keys written once before a change and neither written nor read during it (only the
    pull can bring them to a new home replica), as a `Load` that never runs."""
    written = Load(client.url, client.token)
    for i in range(count):
        key = f"{prefix}{i}"
        answer = client.put(NS, key, b"7")
        assert answer.status_code == 200, answer.text
        written.acked[key] = 7
    return written


def with_a_candidate(running: kvc.Cluster) -> tuple[kvc.Client, list[kvc.Replicator], Load]:
    """The namespace, a third replicator C started (a candidate of the view of A and B) and
    keys written before any change: (client, [A, B, C], those keys)."""
    client = start(running)
    replicators = [running.replicators["A"], running.replicators["B"], running.add("C")]
    return client, replicators, cold(client, "cold-")


def check_nothing_lost(
    running: kvc.Cluster, client: kvc.Client, load: Load, before: Load, sites: list[str]
) -> None:
    """No read went back, writes got through, and every acknowledged write (and every key
    written before the change) is on its home replicas among `sites` and read back."""
    assert not load.violations, load.violations[:10]
    assert load.answers["put 200"] > 10, load.answers
    check_held(running, before, sites)
    check_held(running, load, sites)
    check_reads(client, load)


def join_then_kill(running: kvc.Cluster, sites: list[str]) -> None:
    """After 2 s of load, the join of C to `sites` is accepted, then C is SIGKILLed."""
    time.sleep(2)
    joined = admin(running, "PUT", "/ds/storages/kv/replicas", sites)
    assert joined.status_code == 202, joined.text
    running.kill("C")


def test_a_site_joins_then_one_leaves_while_clients_write_and_read(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B"), **QUIET) as running:
        client = start(running)
        a, b = running.replicators["A"], running.replicators["B"]
        before = storage(running)
        assert before["version"] == 1
        assert before["sites"] == sorted([a.site, b.site])
        assert before["shards"][0]["id"] == "0-65535"
        c = running.add("C")
        assert c.get("/internal/kv/status")["sites"] == sorted([a.site, b.site])

        # -- bad bodies: 400 (or 404), and nothing changes --------------------------------
        for body, code in (
            (["not-a-site"], "BAD_REQUEST"),
            ([], "BAD_REQUEST"),
            ([a.site, a.site], "BAD_REQUEST"),
            ([a.site, "0123456789ABCDEF"], "UNKNOWN_SITES"),
            ([c.site], "REPLICA_SET_TOO_SMALL"),  # the namespace has n=2
        ):
            refused = admin(running, "PUT", "/ds/storages/kv/replicas", body)
            assert refused.status_code == 400, (body, refused.text)
            assert refused.json()["error"] == code, refused.text
        not_in = admin(running, "DELETE", f"/ds/storages/kv/replicas/{c.site}")
        assert not_in.status_code == 404, not_in.text
        assert storage(running) == before
        for replicator in running.replicators.values():
            assert members_file(replicator)["change"] is None
            assert members_file(replicator)["view"]["version"] == 1

        # -- C joins under load ------------------------------------------------------------
        before_join = cold(client, "cold-join-")
        with Load(running.ingress_url, client.token) as load:
            time.sleep(3)
            asked = time.monotonic()
            joined = admin(running, "PUT", "/ds/storages/kv/replicas", [a.site, b.site, c.site])
            assert joined.status_code == 202, joined.text
            assert joined.json() == "OK"
            during = storage(running)
            assert during["version"] == 1
            assert during["shards"][0]["transitions"] == [{"site": c.site, "transition": "joining"}]
            three = [a.site, b.site, c.site]
            eventually(lambda: finished(running, 2, three), 60, "the join finished")
            join_s = time.monotonic() - asked
        assert not load.violations, load.violations[:10]
        assert load.answers["put 200"] > 20, load.answers
        assert load.answers["get 200"] > 20, load.answers
        check_held(running, before_join, three)
        check_held(running, load, three)
        check_reads(client, load)
        check_reads(client, before_join)
        on_c = [
            k
            for k in load.acked
            if c.site in placement.replicas(placement.shard_of(NS, k), three, 2).home
        ]
        assert on_c, "no key moved to C"
        print(f"join finished {join_s:.1f} s after the PUT; {load.answers}")

        # -- A leaves under load (it serves until the change finished) -------------------
        before_leave = cold(client, "cold-leave-")
        with Load(running.ingress_url, client.token, base=1_000_000) as load:
            time.sleep(2)
            left = admin(running, "DELETE", f"/ds/storages/kv/replicas/{a.site}")
            assert left.status_code == 202, left.text
            two = [b.site, c.site]
            eventually(lambda: finished(running, 3, two), 60, "the leave finished")
        assert not load.violations, load.violations[:10]
        check_held(running, before_leave, two)
        check_held(running, before_join, two)
        check_held(running, load, two)
        check_reads(client, load)
        assert members_file(a)["view"] == {"version": 3, "sites": sorted(two)}


def test_a_replicator_killed_mid_change_resumes_it_and_one_started_meanwhile_takes_part(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    env = {**QUIET, "RELAY_REQUEST_TIMEOUT_S": "20"}
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B"), **env) as running:
        client, (a, b, c), before = with_a_candidate(running)
        three = [a.site, b.site, c.site]
        with Load(running.ingress_url, client.token) as load:
            join_then_kill(running, three)  # the change cannot finish without C's reports
            on_disk = members_file(c)
            assert on_disk["change"]["new"] == {"version": 2, "sites": sorted(three)}
            other = admin(running, "PUT", "/ds/storages/kv/replicas", [a.site, b.site])
            assert other.status_code == 409, other.text
            assert other.json()["error"] == "CHANGE_IN_PROGRESS"
            time.sleep(2)
            assert storage(running)["change"]["sites"] == sorted(three)
            # A replicator started now adopts the change; it coordinates nothing until every
            # participant counts it (C is down), and the change then waits for it too.
            d = running.add("D")
            assert d.get("/internal/kv/status")["change"] == sorted(three)
            assert d.site not in members_file(d)["participants"]
            running.restart("C")
            eventually(
                lambda: finished(running, 2, three), 60, "the join finished after C's restart"
            )
            time.sleep(1)
        check_nothing_lost(running, client, load, before, three)
        assert members_file(d)["view"] == {"version": 2, "sites": sorted(three)}


def test_a_dead_joiner_is_forgotten_and_the_change_ends_without_it(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    """C is SIGKILLed for good right after its join started: the change can never hear from it.
    `PUT /ds/sites/{C}/forget` makes every site stop waiting for it; the join ends (C in the
    view, holding nothing), and the lowest live site then starts the change that drops it.
    A live site is refused and nothing changes; C cannot be named again. (An unknown site is
    `tests/api/test_ds.py`'s: with no retainer here, the ingress cannot rule one out.)"""
    env = {**QUIET, "RELAY_REQUEST_TIMEOUT_S": "20"}
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B"), **env) as running:
        client, (a, b, c), before = with_a_candidate(running)
        two, three = [a.site, b.site], [a.site, b.site, c.site]
        with Load(running.ingress_url, client.token) as load:
            join_then_kill(running, three)
            time.sleep(2)
            assert storage(running)["change"]["sites"] == sorted(three)  # waiting for C

            for live in (a, b):  # one answers; the other coordinates (its own site)
                alive = admin(running, "PUT", f"/ds/sites/{live.site}/forget")
                assert alive.status_code == 400, alive.text
                assert alive.json()["error"] == "BAD_REQUEST", alive.text
            assert storage(running)["change"]["sites"] == sorted(three)
            for replicator in (a, b):
                assert members_file(replicator)["forgotten"] == []

            forgot = admin(running, "PUT", f"/ds/sites/{c.site}/forget")
            assert forgot.status_code == 204, forgot.text
            eventually(
                lambda: finished(running, 3, two, dead=("C",)), 60, "C dropped from the view"
            )
            time.sleep(1)
        check_nothing_lost(running, client, load, before, two)
        for replicator in (a, b):
            assert members_file(replicator)["forgotten"] == [c.site]
            assert members_file(replicator)["view"] == {"version": 3, "sites": sorted(two)}
        again = admin(running, "PUT", "/ds/storages/kv/replicas", three)
        assert again.status_code == 400, again.text
        assert "forgotten" in again.json()["detail"], again.text
        assert storage(running)["version"] == 3


def test_two_changes_started_at_once_never_split_the_sites(
    tmp_path: Path, kafka: helpers.Kafka, redis_url: str
) -> None:
    """Two replicators asked at the same moment for different changes (a rebalance of partition
    0 can make two coordinators): at most one is accepted, and only once every participant
    holds it; a refused one leaves nothing behind. Without a compare-and-set start, each site
    kept whichever change reached it first and neither could ever finish."""
    with kvc.cluster(tmp_path, kafka, redis_url, names=("A", "B", "C", "D"), **QUIET) as running:
        start(running)
        by_name = running.replicators
        sites = {name: r.site for name, r in by_name.items()}
        wanted = {
            "A": sorted([sites["A"], sites["B"], sites["C"]]),
            "B": sorted([sites["A"], sites["B"], sites["D"]]),
        }

        def ask(name: str, answers: dict[str, Any]) -> None:
            request = {
                "kind": "kv_request",
                "id": uuid.uuid4().hex,
                "origin": "test",
                "reply_slot": 0,
                "deadline_ms": time.time() * 1000 + 60_000,
                "op": "view_change",
                "ns": "$members",
                "sites": wanted[name],
                "admin": True,
            }
            answers[name] = by_name[name].post("/internal/kv/coordinate", request)

        accepted: list[str] = []
        for _ in range(5):
            answers: dict[str, Any] = {}
            threads = [threading.Thread(target=ask, args=(n, answers)) for n in wanted]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            held = {n: r.get("/internal/kv/status")["change"] for n, r in by_name.items()}
            accepted = [n for n, answer in answers.items() if answer["status"] == 202]
            assert len(accepted) <= 1, answers
            refused = {answer["code"] for answer in answers.values() if answer["status"] != 202}
            assert refused <= {"CHANGE_IN_PROGRESS", "UNAVAILABLE"}, answers
            if accepted:
                assert all(h == wanted[accepted[0]] for h in held.values()), (answers, held)
                break
            assert all(h is None for h in held.values()), (answers, held)  # nothing changed
        assert accepted, "five rounds of two starts: none accepted"
        eventually(
            lambda: finished(running, 2, wanted[accepted[0]]), 60, "the accepted change ended"
        )
