"""The online export end to end (issue 22): `relayctl export --online` (`POST /admin/export`)
while senders keep sending queue messages, retained publications and durable-stream writes (a
`$` topic among them) through the running suite. The answer arrives while writes go on and are
acknowledged; each queue-writer's part stands at its exact cut and each retainer's at the
exact position of each of its stores (read from the marks in its checkpoint), so a rebuild at
that cut verifies clean with nothing uncertain (a send applied after the cut and leaking into
the export would be EXTRA, one applied before it and missing would be MISSING); sends after
the cut exist and are not in the export. The retainer's writes are never held: they go on
while it exports. The endpoint needs the admin token."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from relay_archive import export, standing, tables
from tests import helpers
from tests.api.client import Recipient, b64u
from tests.suite.test_archive_verify import _caught_up, relayctl

pytestmark = pytest.mark.suite
FAST = {"RELAY_ARCHIVE__ROLL_AGE_S": "0.5", "RELAY_ARCHIVE__LAG_INTERVAL_S": "0.5"}
QUEUES = 60


def test_an_online_export_while_writers_run_verifies_clean(
    tmp_path: Path, kafka: helpers.Kafka
) -> None:
    acked: list[tuple[float, str]] = []  # (monotonic time of the answer, what)
    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST) as running:
        data_dir = running.data_dir
        url = running.state.ingress_url
        with httpx.Client(base_url=url, timeout=20) as http:
            recipients = [Recipient(http).create() for _ in range(QUEUES)]
            for r in recipients:
                for i in range(3):
                    assert r.send(b"before %d" % i).status_code == 201
            for n in range(10):
                body = {"topic": f"dev/{n}/state", "payload": b64u(b"on"), "retain": True}
                assert http.post("/v1/publish", json=body).status_code == 202
            stream = [{"topic": "$ops/log", "payload": b64u(b"dollar")}]
            assert http.post("/v1/ds/messages/messages", json=stream).status_code == 201

            refused = httpx.post(f"{url}/admin/export", headers={"Authorization": "Bearer no"})
            assert (refused.status_code, refused.json()["error"]) == (403, "FORBIDDEN")
            auth = {"Authorization": f"Bearer {running.token()}"}
            for bad in ("0", "601", "soon"):
                refused = httpx.post(f"{url}/admin/export?timeout_s={bad}", headers=auth)
                assert (refused.status_code, refused.json()["error"]) == (400, "BAD_REQUEST")
            assert not list(data_dir.glob("*/exports"))  # refused: nothing written

            stop = threading.Event()

            def send_until_stopped(offset: int) -> None:
                with httpx.Client(base_url=url, timeout=20) as own:
                    n = offset
                    while not stop.is_set():
                        r = recipients[n % QUEUES]
                        answer = own.post(f"/v1/send/{r.sender}", json={"body": b64u(b"during")})
                        assert answer.status_code == 201, answer.text
                        acked.append((time.monotonic(), "send"))
                        n += 1

            def publish_until_stopped(offset: int) -> None:
                with httpx.Client(base_url=url, timeout=20) as own:
                    n = offset
                    while not stop.is_set():
                        payload = b64u(b"%d" % n)
                        body = {"topic": f"dev/{n % 10}/state", "payload": payload, "retain": True}
                        assert own.post("/v1/publish", json=body).status_code == 202
                        topic = "$ops/log" if n % 3 == 0 else f"log/{n % 5}"
                        write = [{"topic": topic, "payload": payload}]
                        answer = own.post("/v1/ds/messages/messages", json=write)
                        assert answer.status_code == 201, answer.text
                        acked.append((time.monotonic(), "stream"))
                        n += 1

            writers = [threading.Thread(target=send_until_stopped, args=(k * 7,)) for k in range(2)]
            # Three: the retainer's export can take a few tens of milliseconds, and on a loaded
            # machine one writer's next write (two round trips) missed it (0 writes during).
            writers += [
                threading.Thread(target=publish_until_stopped, args=(k << 20,)) for k in range(3)
            ]
            for writer in writers:
                writer.start()
            try:
                while len(acked) < 20:  # the writers are under way
                    time.sleep(0.05)
                asked = time.monotonic()
                out = tmp_path / "export"
                done = relayctl(
                    "export", "--online", "--data-dir", str(data_dir), "--out", str(out)
                )
                answered = time.monotonic()
                assert done.returncode == 0, done.stdout + done.stderr
                during = [what for t, what in acked if asked < t < answered]
                while len(acked) < len(during) + 40:  # and they go on after the answer
                    time.sleep(0.05)
            finally:
                stop.set()
                for writer in writers:
                    writer.join(timeout=30)
        print(done.stdout)  # the figures decision 0012 quotes (pytest -s)
        assert "send" in during, "no send was acknowledged while the export ran"
        assert "commands waited at most" in done.stdout
        found = re.search(
            r"cut (\w+); writes went on, (\d+) waited at most ([\d.]+) ms", done.stdout
        )
        assert found is not None, done.stdout
        assert found[1] == "exact"
        assert int(found[2]) > 0  # the retainer took writes while it exported
        exported = tables.read_table(out, "messages")
        sends = QUEUES * 3 + sum(1 for _, what in acked if what == "send")
        assert QUEUES * 3 <= exported.num_rows < sends  # sends after the cut are not in it
        streams = tables.read_table(out, "streams").to_pylist()
        assert any(row["topic"] == "$ops/log" for row in streams)
        assert tables.read_table(out, "retained").num_rows == 10
        cut = export.read_cut(out, export.read_manifest(out))
        assert cut.offsets is not None
        assert set(cut.offsets) == set(range(8))
        assert cut.publications is not None
        assert cut.publications_upto is not None
        assert set(cut.publications) == set(cut.publications_upto) == set(range(8))
        assert all(cut.publications[p] <= cut.publications_upto[p] for p in range(8))
        # Exact: every partition places the retained store and each stream shard.
        shards = {p: cut.shards[p]["messages"] for p in range(8)}
        for p in range(8):
            wanted = {standing.RETAINED, *(f"streams/messages/{s}" for s in range(shards[p]))}
            assert set(cut.stores[p]) == wanted, cut.stores[p]
            assert all(o <= cut.publications_upto[p] for o in cut.stores[p].values())
        assert export.covered(out) == export.EVERY_TABLE
        _caught_up(data_dir)
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=30) == 0

    d = str(data_dir)
    rebuilt = tmp_path / "rebuilt"
    done = relayctl(
        "rebuild",
        "--data-dir",
        d,
        "--export",
        str(out),
        "--out",
        str(rebuilt),
        "--engine",
        "python",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert tables.read_table(rebuilt, "messages").num_rows == exported.num_rows
    report = tmp_path / "report"
    done = relayctl(
        "verify",
        "--data-dir",
        d,
        "--export",
        str(out),
        "--rebuilt",
        str(rebuilt),
        "--report",
        str(report),
        "--engine",
        "python",
    )
    document = json.loads((report / "report.json").read_text())
    assert done.returncode == 0, json.dumps(document["differences"][:20]) + done.stderr[-2000:]
    assert document["verdict"] == "clean"
    assert not any(d["klass"] == "MISSING" for d in document["differences"])
    # Nothing of the publications is uncertain: no window, every write placed by its store.
    uncertain = tables.read_table(rebuilt, "uncertain").to_pylist()
    assert not [u for u in uncertain if u["op"] in ("retain", "stream")], uncertain
