"""The archive audit with Spark's Kafka connector (issue 22), against the suite's real Apache
Kafka: a caught-up archive covers every offset Kafka holds (clean, exit 0); an archive file
removed from the middle of a slot is a gap naming its topic, partition and offsets (exit 2);
without the connector's jars the audit refuses in one line (exit 64)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from relay_archive import reader
from relay_archive.store import LocalStore
from relay_bus import topics
from tests import helpers
from tests.api.client import Recipient

pytestmark = pytest.mark.suite


def relayctl(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helpers.BIN / "relayctl"), *args],
        capture_output=True,
        text=True,
        check=False,
        env=helpers.service_env(**env),
        cwd=helpers.ROOT,
        timeout=300,
    )


def _commands_files(store: LocalStore) -> int:
    """Archived files of the queue commands (a file of another topic, the replies' or the
    pings', may roll first: counting every file let one round's sends share a file)."""
    return sum(f.slot.topic == topics.QUEUE_COMMANDS for f in store.list_files())


def _new_file(store: LocalStore, before: int) -> None:
    """Wait until the archive holds more than `before` files of the queue commands."""
    deadline = time.monotonic() + 60
    while _commands_files(store) <= before:
        assert time.monotonic() < deadline, "the archiver wrote no new file"
        time.sleep(0.2)


def _audit(data_dir: Path, **env: str) -> tuple[int, dict[str, object], str]:
    done = relayctl("archive", "audit", "--data-dir", str(data_dir), **env)
    lines = done.stdout.strip().splitlines()
    return done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr


def test_the_audit_finds_a_caught_up_archive_clean_and_a_removed_file_a_gap(
    tmp_path: Path, kafka: helpers.Kafka
) -> None:
    fast = {"RELAY_ARCHIVE__ROLL_AGE_S": "0.3", "RELAY_ARCHIVE__LAG_INTERVAL_S": "0.5"}
    with helpers.suite(tmp_path, "--port", "0", kafka=kafka, **fast) as running:
        data_dir = running.data_dir
        store = LocalStore(data_dir / "archive")
        with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
            recipient = Recipient(http).create()
            for _ in range(3):  # three rounds, each archived before the next: several files
                before = _commands_files(store)
                for i in range(5):
                    assert recipient.send(b"message %d" % i).status_code == 201
                _new_file(store, before)
        epoch = reader.epochs(store)[0]
        folder = f"v1/epoch={epoch}/topic={topics.QUEUE_COMMANDS}"
        slots = reader.by_slot(store.list_files(folder))
        partition, files = max(slots.items(), key=lambda item: len(item[1]))
        assert len(files) >= 2, [f.path for f in store.list_files(folder)]

        code, doc, stderr = _audit(data_dir)
        assert code == 0, (doc, stderr)
        assert doc["verdict"] == "clean"
        assert doc["counts"]["held"] > 15  # the sends, their queue creation, admin and pings
        assert doc["gaps"] == []

        first = min(files, key=lambda f: f.first)
        (Path(store.root) / first.path).unlink()
        code, doc, stderr = _audit(data_dir)
        assert code == 2, (doc, stderr)
        assert doc["verdict"] == "gaps"
        assert doc["gaps"] == [
            {
                "topic": topics.QUEUE_COMMANDS,
                "partition": partition.partition,
                "first": first.first,
                "last": first.last,
                "count": first.last - first.first + 1,
            }
        ]

        code, doc, stderr = _audit(data_dir, RELAY_SPARK_KAFKA_JARS=str(tmp_path / "none"))
        assert code == 64
        assert stderr.strip().count("\n") == 0
        assert "Kafka connector is missing" in stderr
