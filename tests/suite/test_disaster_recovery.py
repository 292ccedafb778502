"""Disaster recovery end to end (issue 22): a queue-writer's data dir is lost; the archive is
rebuilt, the data dir restored from it (`relayctl rebuild`, `relayctl restore`), the suite
started again: every acknowledged, unacknowledged-by-the-recipient message is delivered, new
commands go on from Kafka, and verify finds the live state clean. Likewise a retainer's data
dir: its retained messages and its durable streams (a `$` topic among them) come back, read
through the API, and new writes go on."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import httpx
import pytest

from relay_archive import reader, rebuild, tables
from relay_archive.store import LocalStore
from tests import helpers
from tests.api.client import Recipient, b64u
from tests.api.test_ds import replay
from tests.suite.test_archive_verify import _caught_up, relayctl

pytestmark = pytest.mark.suite
FAST = {"RELAY_ARCHIVE__ROLL_AGE_S": "0.5", "RELAY_ARCHIVE__LAG_INTERVAL_S": "0.5"}


def _stop(running: helpers.Running) -> None:
    running.process.send_signal(signal.SIGTERM)
    assert running.process.wait(timeout=30) == 0


def test_a_lost_queue_writer_is_rebuilt_restored_and_delivers_everything(
    tmp_path: Path, kafka: helpers.Kafka
) -> None:
    pending: dict[str, list[str]] = {}
    keys: dict[str, Recipient] = {}
    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST) as running:
        with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
            for _ in range(4):
                r = Recipient(http).create()
                keys[r.queue] = r
                pending[r.queue] = []
                for i in range(5):
                    answer = r.send(b"before the loss %d" % i)
                    assert answer.status_code == 201, answer.text
                    pending[r.queue].append(answer.json()["msg_id"])
                head = r.call("GET", "/head").json()
                assert r.call("POST", "/ack", {"msg_id": head["msg_id"]}).status_code == 200
                pending[r.queue].pop(0)
        _caught_up(running.data_dir)
        _stop(running)
    data_dir = running.data_dir
    d = str(data_dir)
    shutil.rmtree(data_dir / "queue-writer-0")  # the volume is gone

    rebuilt = tmp_path / "rebuilt"
    done = relayctl("rebuild", "--data-dir", d, "--out", str(rebuilt), "--engine", "python")
    assert done.returncode == 0, done.stderr[-3000:]
    done = relayctl(
        "restore",
        "queue-writer",
        "--from",
        str(rebuilt),
        "--ordinal",
        "0",
        "--data-dir",
        str(data_dir / "queue-writer-0"),
    )
    assert done.returncode == 0, done.stderr
    assert "restored 4 queues, 16 messages" in done.stdout

    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST) as running:
        with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
            for queue, r in keys.items():
                r.http = http
                after = r.send(b"after the restore")
                assert after.status_code == 201, after.text
                pending[queue].append(after.json()["msg_id"])
                received = []
                head = r.call("GET", "/head")
                while head.status_code == 200:
                    msg_id = head.json()["msg_id"]
                    received.append(msg_id)
                    head = r.call("POST", "/ack", {"msg_id": msg_id})
                assert head.status_code == 204, head.text
                assert received == pending[queue]  # all of them, in order, once
        _caught_up(running.data_dir)
        _stop(running)

    out = tmp_path / "check"
    assert relayctl("export", "--data-dir", d, "--out", str(out / "export")).returncode == 0
    done = relayctl(
        "rebuild",
        "--data-dir",
        d,
        "--export",
        str(out / "export"),
        "--out",
        str(out / "rebuilt"),
        "--engine",
        "python",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    done = relayctl(
        "verify",
        "--data-dir",
        d,
        "--export",
        str(out / "export"),
        "--rebuilt",
        str(out / "rebuilt"),
        "--report",
        str(out / "report"),
        "--engine",
        "python",
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads((out / "report" / "report.json").read_text())["verdict"] == "clean"


def _verify_clean(tmp_path: Path, d: str) -> None:
    out = tmp_path / "check"
    assert relayctl("export", "--data-dir", d, "--out", str(out / "export")).returncode == 0
    rebuild = ["rebuild", "--data-dir", d, "--export", str(out / "export")]
    done = relayctl(*rebuild, "--out", str(out / "rebuilt"), "--engine", "python")
    assert done.returncode == 0, done.stderr[-3000:]
    done = relayctl(
        "verify",
        "--data-dir",
        d,
        "--export",
        str(out / "export"),
        "--rebuilt",
        str(out / "rebuilt"),
        "--report",
        str(out / "report"),
        "--engine",
        "python",
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads((out / "report" / "report.json").read_text())["verdict"] == "clean"


def test_a_lost_retainer_gets_its_retained_messages_and_streams_back(
    tmp_path: Path, kafka: helpers.Kafka
) -> None:
    """A retainer's volume is lost. Restored from a rebuild of an archive that had not caught up
    (a copy taken before the last writes, put back: as if the archiver lagged), it refuses to
    start, naming the partitions whose committed offsets pass the archive's end (reading them
    again could not bring those writes back: a request read past its deadline is dropped).
    Restored again once the archive has caught up, it reads on from the archive's end, and
    everything acknowledged is there."""
    written: list[tuple[str, str]] = []
    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST) as running:
        with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
            for i in range(12):
                topic = "$ops/log" if i % 4 == 0 else f"log/{i % 3}"
                payload = b64u(b"before the loss %d" % i)
                write = [{"topic": topic, "payload": payload}]
                assert http.post("/v1/ds/messages/messages", json=write).status_code == 201
                written.append((topic, payload))
            for n in range(5):
                body = {"topic": f"dev/{n}/state", "payload": b64u(b"on"), "retain": True}
                assert http.post("/v1/publish", json=body).status_code == 202
            wait_archived(running.data_dir, retained=5, streams=12)
            shutil.copytree(running.data_dir / "archive", tmp_path / "archive-lagging")
            for n in range(5, 8):
                body = {"topic": f"dev/{n}/state", "payload": b64u(b"late"), "retain": True}
                assert http.post("/v1/publish", json=body).status_code == 202
            late = {"topic": "log/1", "payload": b64u(b"after the lagging archive's end")}
            assert http.post("/v1/ds/messages/messages", json=[late]).status_code == 201
            written.append((late["topic"], late["payload"]))
            wait_retained(http, 8)
        wait_archived(running.data_dir, retained=8, streams=13)
        _stop(running)
    data_dir = running.data_dir
    d = str(data_dir)
    shutil.move(data_dir / "archive", tmp_path / "archive-caught-up")
    shutil.copytree(tmp_path / "archive-lagging", data_dir / "archive")

    def lose_and_restore(rebuilt: Path) -> str:
        shutil.rmtree(data_dir / "retainer-0")  # the volume is gone
        done = relayctl("rebuild", "--data-dir", d, "--out", str(rebuilt), "--engine", "python")
        assert done.returncode == 0, done.stderr[-3000:]
        target = str(data_dir / "retainer-0")
        done = relayctl(
            "restore", "retainer", "--from", str(rebuilt), "--ordinal", "0", "--data-dir", target
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "restored 5 retained messages, 12 durable-stream messages" in lose_and_restore(
        tmp_path / "rebuilt-lagging"
    )
    refused = "restored from an archive that ended before"
    with (
        pytest.raises(AssertionError, match=refused),
        helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST),
    ):
        pass
    shutil.rmtree(data_dir / "archive")  # the archiver caught up
    shutil.move(tmp_path / "archive-caught-up", data_dir / "archive")
    restored = lose_and_restore(tmp_path / "rebuilt")
    assert "restored 8 retained messages, 13 durable-stream messages" in restored

    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **FAST) as running:
        with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
            after = [{"topic": "log/0", "payload": b64u(b"after the restore")}]
            assert http.post("/v1/ds/messages/messages", json=after).status_code == 201
            found = replay(http, "#") + replay(http, "$ops/#")
            held = sorted((m["topic"], m["payload"]) for m in found)
            assert held == sorted([*written, ("log/0", b64u(b"after the restore"))])
            wait_retained(http, 8)
        assert not (data_dir / "retainer-0" / "resume.json").exists()
        _caught_up(running.data_dir)
        _stop(running)
    _verify_clean(tmp_path, d)


def wait_retained(http: httpx.Client, count: int) -> None:
    """Until the retainer holds `count` retained messages under `dev/` (publishes are applied
    asynchronously after their 202)."""
    deadline = time.monotonic() + 30
    while True:
        retained = http.get("/v1/retained", params={"filter": "dev/#"})
        assert retained.status_code == 200, retained.text
        if len(retained.json()["messages"]) == count:
            return
        assert time.monotonic() < deadline, retained.json()
        time.sleep(0.2)


def wait_archived(data_dir: Path, *, retained: int, streams: int) -> None:
    """Until a rebuild of the archive as it stands holds `retained` retained messages and
    `streams` stream messages (the archiver's reported lag is sampled, so it can read 0 just
    before new records reach it)."""
    store = LocalStore(data_dir / "archive")
    deadline = time.monotonic() + 60
    while True:
        epochs = reader.epochs(store)
        if epochs:
            cut = tables.Cut(epochs[0], int(time.time() * 1000))
            held = (
                len(rebuild.rebuild_retained(store, cut).topics),
                len(tables.stream_rows(rebuild.rebuild_streams(store, cut))),
            )
            if held == (retained, streams):
                return
        assert time.monotonic() < deadline, f"archived: {held if epochs else None}"
        time.sleep(0.3)
