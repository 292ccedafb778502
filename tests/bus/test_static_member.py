"""Static group membership (KIP-345) on Apache Kafka: a group consumer killed with SIGKILL and
started again under its member name gets its partitions back at once, instead of waiting for
the killed process's session to expire (the replicator's coordinators use it); a killed one
removed by another process (`Bus.remove_static_member`) leaves its partitions to the live
members at once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_runtime.readiness import Readiness
from tests.helpers import Kafka

CHILD = """
import asyncio, sys
from relay_bus import topics
from relay_bus.bus import Bus
from relay_bus.config import KafkaSettings
from relay_runtime.readiness import Readiness

async def main() -> None:
    settings = KafkaSettings(
        bootstrap_servers=sys.argv[1], topic_prefix=sys.argv[2], partitions=4,
        session_timeout_ms=45_000,
    )
    readiness = Readiness()
    bus = Bus(settings, client_id=sys.argv[3], readiness=readiness)
    async def handle(received: object) -> None:
        pass
    consumer = bus.consumer(topics.QUEUE_EVENTS, handle, group_id="static", member=sys.argv[3])
    await bus.start(30)
    while not readiness.ready:
        await asyncio.sleep(0.05)
    shown = None
    while True:  # every change of what it holds, the first once ready
        if consumer.held() != shown:
            shown = consumer.held()
            print("held", shown, flush=True)
        await asyncio.sleep(0.05)

asyncio.run(main())
"""


def start(kafka: Kafka, member: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, kafka.bootstrap, kafka.prefix, member],
        stdout=subprocess.PIPE,
        text=True,
    )


def held(process: subprocess.Popen[str]) -> list[int]:
    """The next partitions the child printed as held (its logs come first on the same pipe)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("held "):
            return [int(p) for p in line[len("held [") : -2].split(",") if p.strip()]
    raise AssertionError(f"the child ended without joining (exit {process.wait()})")


def test_a_killed_static_member_restarted_gets_its_partitions_back_at_once(kafka: Kafka) -> None:
    a, b = start(kafka, "member-a"), start(kafka, "member-b")
    try:
        held(a)
        held(b)  # both joined; wait until the group settled on two members
        time.sleep(3)
        a.kill()
        a.wait()
        started = time.monotonic()
        again = start(kafka, "member-a")
        try:
            got = held(again)
            waited = time.monotonic() - started
            # A dynamic member would wait for the killed one's 45 s session to expire.
            assert waited < 25, waited
            assert got, "the restarted member holds partitions again"
        finally:
            again.kill()
            again.wait()
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
                process.wait()


async def remove(kafka: Kafka, member: str) -> list[bool]:
    """Remove `member` from the children's group twice, as two processes that both saw it die."""
    settings = KafkaSettings(
        bootstrap_servers=kafka.bootstrap, topic_prefix=kafka.prefix, partitions=4
    )
    bus = Bus(settings, client_id="remover", readiness=Readiness())
    await bus.start(30)
    try:
        return [await bus.remove_static_member("static", member) for _ in range(2)]
    finally:
        await bus.stop()


def test_a_killed_static_member_removed_leaves_its_partitions_to_the_others(kafka: Kafka) -> None:
    a, b = start(kafka, "member-a"), start(kafka, "member-b")
    try:
        held(a)
        first = held(b)
        while len(first) != 2:  # the group settles on two members
            first = held(b)
        a.kill()
        a.wait()
        started = time.monotonic()
        assert asyncio.run(remove(kafka, "member-a")) == [True, False]
        while held(b) != [0, 1, 2, 3]:  # (a revocation may be printed first)
            pass
        # Without the removal, the killed member's partitions would wait out its 45 s session.
        assert time.monotonic() - started < 15
    finally:
        for process in (a, b):
            process.kill()
            process.wait()
