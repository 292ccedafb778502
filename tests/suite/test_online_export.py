"""The online export end to end (issue 22): `relayctl export --online` (`POST /admin/export`)
while senders keep sending through the running suite. The answer arrives while sends go on
and are acknowledged; each queue-writer's part stands at its exact cut, so a rebuild at that
cut verifies clean (a send applied after the cut and leaking into the export would be EXTRA,
one applied before it and missing would be MISSING); sends after the cut exist and are not in
the export. The endpoint needs the admin token."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from relay_archive import export, tables
from tests import helpers
from tests.api.client import Recipient
from tests.suite.test_archive_verify import _caught_up, relayctl

pytestmark = pytest.mark.suite
FAST = {"RELAY_ARCHIVE__ROLL_AGE_S": "0.5", "RELAY_ARCHIVE__LAG_INTERVAL_S": "0.5"}
QUEUES = 60


def test_an_online_export_while_senders_run_verifies_clean(tmp_path: Path) -> None:
    acked: list[tuple[float, str]] = []  # (monotonic time of the 201, msg_id)
    with helpers.suite(tmp_path, "--port", "0", **FAST) as running:
        data_dir = running.data_dir
        url = running.state.ingress_url
        with httpx.Client(base_url=url, timeout=20) as http:
            recipients = [Recipient(http).create() for _ in range(QUEUES)]
            for r in recipients:
                for i in range(3):
                    assert r.send(b"before %d" % i).status_code == 201

            refused = httpx.post(f"{url}/admin/export", headers={"Authorization": "Bearer no"})
            assert (refused.status_code, refused.json()["error"]) == (403, "FORBIDDEN")

            stop = threading.Event()

            def send_until_stopped(offset: int) -> None:
                with httpx.Client(base_url=url, timeout=20) as own:
                    n = offset
                    while not stop.is_set():
                        r = recipients[n % QUEUES]
                        answer = own.post(
                            f"/v1/send/{r.sender}", json={"body": "ZHVyaW5n"}
                        )  # b"during"
                        assert answer.status_code == 201, answer.text
                        acked.append((time.monotonic(), answer.json()["msg_id"]))
                        n += 1

            senders = [threading.Thread(target=send_until_stopped, args=(k * 7,)) for k in range(2)]
            for sender in senders:
                sender.start()
            try:
                while len(acked) < 20:  # the senders are under way
                    time.sleep(0.05)
                asked = time.monotonic()
                out = tmp_path / "export"
                done = relayctl(
                    "export", "--online", "--data-dir", str(data_dir), "--out", str(out)
                )
                answered = time.monotonic()
                assert done.returncode == 0, done.stdout + done.stderr
                during = [t for t, _ in acked if asked < t < answered]
                while len(acked) < len(during) + 40:  # and they go on after the answer
                    time.sleep(0.05)
            finally:
                stop.set()
                for sender in senders:
                    sender.join(timeout=30)
        assert during, "no send was acknowledged while the export ran"
        assert "commands waited at most" in done.stdout
        exported = tables.read_table(out, "messages")
        total = QUEUES * 3 + len(acked)
        assert QUEUES * 3 <= exported.num_rows < total  # sends after the cut are not in it
        cut = export.read_cut(out, export.read_manifest(out))
        assert cut.offsets is not None
        assert set(cut.offsets) == set(range(8))
        assert export.covered(out) == export.QUEUE_TABLES
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
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    document = json.loads((report / "report.json").read_text())
    assert document["verdict"] == "clean"
