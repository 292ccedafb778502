"""Loss and order under SIGKILL (issue 6): the load of `tests.suite.load` while every kind of
service process and the broker are killed in turn (relayctl restarts them)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests import helpers
from tests.suite import load

pytestmark = pytest.mark.suite

QUEUES = 12
KILL_EVERY_S = 3.0
RECOVER_S = 7.0  # under load after the last kill
VICTIMS = [
    "broker",
    "relay-queue-writer-0",
    "relay-delivery-0",
    "relay-ingress-0",
    "relay-queue-writer-1",
    "relay-retainer-0",
    "relay-delivery-1",
    "relay-ingress-1",
    "relay-replicator-0",
]


def test_nothing_acknowledged_is_lost_under_kills(tmp_path: Path) -> None:
    args = ["--port", "0", "--ingress", "2", "--queue-writers", "2", "--delivery", "2"]
    with helpers.suite(tmp_path, *args) as running:

        async def killer(record: load.Record) -> None:
            for name in VICTIMS:
                await asyncio.sleep(KILL_EVERY_S)
                child = next(c for c in running.state.children if c.name == name)
                assert child.pid is not None
                os.kill(child.pid, signal.SIGKILL)
                record.kills.append(name)

        record = load.run(running, QUEUES, killer, RECOVER_S)
    assert record.kills == VICTIMS
    load.check(record)
