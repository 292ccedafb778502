"""Subscriptions across process deaths (issue 18), against `relayctl up` with real processes
killed by SIGKILL (relayctl restarts them):

- a SUB refused for its signature changes nothing in the registry, so after a delivery restart
  the owner of the queue still gets its messages (the attack of issue 18);
- END reaches the previous subscriber when a second connection takes the queue over, also when
  delivery is killed between the two SUBs (the registry keeps who held the queue);
- a message a killed queue-writer made durable but never announced reaches the live subscriber
  once the queue-writer is back, without any client action.

Waits are bounded (a restarted delivery joins its consumer group within a session timeout),
never asserted on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from websockets.asyncio.client import ClientConnection

from relay_bus import topics
from relay_journal.journal import QueueJournal
from relay_journal.settings import JournalSettings
from relay_queues import ids
from tests import helpers
from tests.api.client import Recipient
from tests.api.test_websocket import connect, recv, send

pytestmark = pytest.mark.suite

BACK_S = 90.0
"""How long a frame that needs a restarted process may take (a consumer group's rejoin, on a
machine shared with other suites)."""


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helpers.Running]:
    with helpers.suite(tmp_path_factory.mktemp("suite"), "--port", "0") as running:
        yield running


@pytest.fixture
def http(running: helpers.Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=running.state.ingress_url, timeout=20) as client:
        yield client


@pytest.fixture
def ws_url(running: helpers.Running) -> str:
    return running.state.ingress_url.replace("http://", "ws://") + "/v1/ws"


def _pid(running: helpers.Running, name: str) -> int:
    child = next(c for c in running.state.children if c.name == name)
    assert child.pid is not None
    return child.pid


def _kill(running: helpers.Running, name: str) -> int:
    """SIGKILL the child `name`; returns its pid."""
    pid = _pid(running, name)
    os.kill(pid, signal.SIGKILL)
    return pid


async def _delivery_caught_up(running: helpers.Running) -> None:
    """Wait until delivery's group has committed every event written so far: a delivery killed
    now replays nothing (a replayed `subscribed` event would hand the old subscriber its END by
    itself, and the test would not show that the registry does)."""
    broker = next(c for c in running.state.children if c.name == "broker")
    bootstrap = f"127.0.0.1:{broker.port}"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await consumer.start()
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topics.QUEUE_EVENTS])
        partitions = sorted(p["partition"] for p in described["partitions"])
        tps = [TopicPartition(topics.QUEUE_EVENTS, p) for p in partitions]
        assert tps
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + BACK_S
        while True:
            offsets = await admin.list_consumer_group_offsets("relay.delivery")
            committed = {tp: meta.offset for tp, meta in offsets.items() if tp in ends}
            if all(committed.get(tp, 0) >= end for tp, end in ends.items()):
                return
            assert time.monotonic() < deadline, (committed, ends)
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()
        await admin.close()


def _restarted(running: helpers.Running, name: str, old_pid: int) -> None:
    """Wait until relayctl runs `name` again under a new pid."""
    deadline = time.monotonic() + BACK_S
    while _pid(running, name) == old_pid:
        assert time.monotonic() < deadline, f"{name} not restarted"
        time.sleep(0.1)


async def _until(
    ws: ClientConnection, wanted: Callable[[dict[str, Any]], bool], timeout_s: float = BACK_S
) -> list[dict[str, Any]]:
    """Frames read until one is `wanted` (the list ends with it)."""
    frames: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while not frames or not wanted(frames[-1]):
        frames.append(await recv(ws, max(0.1, deadline - time.monotonic())))
    return frames


async def _hello(ws: ClientConnection) -> str:
    await send(ws, {"id": "hello", "cmd": "HELLO"})
    reply = await recv(ws)
    session: str = reply["session"]
    return session


def _is_msg(r: Recipient, msg_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f.get("type") == "MSG" and (f["queue"], f["msg_id"]) == (r.queue, msg_id)


def _is_end(r: Recipient) -> Callable[[dict[str, Any]], bool]:
    return lambda f: f == {"type": "END", "queue": r.queue}


def test_a_refused_sub_does_not_erase_the_owners_subscription(
    running: helpers.Running, http: httpx.Client, ws_url: str
) -> None:
    """Issue 18's attack: the owner SUBs; someone who knows only the recipient id SUBs with a
    bad signature (AUTH); delivery is killed and comes back from the registry. The owner still
    gets the next message, as a control queue the attacker never touched does."""
    owned, control = Recipient(http).create(), Recipient(http).create()
    attacker = Recipient(http)
    attacker.queue = owned.queue

    async def run() -> None:
        async with connect(ws_url) as owner, connect(ws_url) as thief:
            for r in (owned, control):
                await send(owner, r.sub(f"sub-{r.queue}"))
                assert await recv(owner) == {"id": f"sub-{r.queue}", "ok": True}
            await send(thief, attacker.sub("attack"))
            reply = await recv(thief)
            assert (reply["ok"], reply["error"]) == (False, "AUTH")
            old = _kill(running, "relay-delivery-0")
            await asyncio.to_thread(_restarted, running, "relay-delivery-0", old)
            sent_control = control.send(b"control").json()["msg_id"]
            sent_owned = owned.send(b"owned").json()["msg_id"]
            frames = await _until(owner, _is_msg(control, sent_control))
            if not any(_is_msg(owned, sent_owned)(f) for f in frames):
                frames += await _until(owner, _is_msg(owned, sent_owned))
            assert not [f for f in frames if f.get("type") == "END"], frames

    asyncio.run(run())


@pytest.mark.parametrize("kill_delivery", [False, True], ids=["alive", "delivery-SIGKILLed"])
def test_a_second_bound_sub_in_the_same_second_takes_over_and_the_first_gets_end(
    running: helpers.Running, http: httpx.Client, ws_url: str, kill_delivery: bool
) -> None:
    """Two connections SUB the same queue with bound frames of the same timestamp: the second
    gets the message in flight again, the first gets END; with delivery SIGKILLed between the
    two SUBs, the delivery that comes back learns from the registry who held the queue."""
    r = Recipient(http).create()
    in_flight = r.send(b"in flight").json()["msg_id"]
    ts = int(time.time())

    async def run() -> None:
        async with connect(ws_url) as first, connect(ws_url) as second:
            await send(first, r.sub("first", ts=ts, session=await _hello(first)))
            assert await recv(first) == {"id": "first", "ok": True}
            assert _is_msg(r, in_flight)(await recv(first))
            if kill_delivery:
                await _delivery_caught_up(running)
                old = _kill(running, "relay-delivery-0")
            await send(second, r.sub("second", ts=ts, session=await _hello(second)))
            assert await recv(second) == {"id": "second", "ok": True}
            if kill_delivery:
                await asyncio.to_thread(_restarted, running, "relay-delivery-0", old)
            await _until(second, _is_msg(r, in_flight))
            assert await _until(first, lambda f: True) == [{"type": "END", "queue": r.queue}]
            # The second holds the queue: the next message goes to it alone.
            following = r.send(b"following").json()["msg_id"]
            await send(second, r.ack(in_flight, "ack"))
            frames = await _until(second, _is_msg(r, following))
            assert {"id": "ack", "ok": True} in frames
            with pytest.raises(TimeoutError):
                await recv(first, 1.0)

    asyncio.run(run())


@contextlib.contextmanager
def _supervisor_paused(running: helpers.Running) -> Iterator[None]:
    """relayctl stopped (SIGSTOP): a child killed meanwhile is restarted only after."""
    running.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        running.process.send_signal(signal.SIGCONT)


def test_a_message_stored_but_never_announced_reaches_the_live_subscriber(
    running: helpers.Running, http: httpx.Client, ws_url: str
) -> None:
    """The state a SIGKILL between the queue-writer's fsync and its posts leaves (the SEND's
    asker got 503; decision 0005): the message is in the journal, and no event told delivery.
    Made exactly: the queue-writer is SIGKILLed while relayctl is paused, the message is appended
    to its journal as the killed process had made it durable, and relayctl restarts it. The live
    subscriber gets the message without doing anything."""
    r = Recipient(http).create()
    msg_id = ids.new_id()

    async def run() -> None:
        async with connect(ws_url) as ws:
            await send(ws, r.sub("sub"))
            assert await recv(ws) == {"id": "sub", "ok": True}
            with _supervisor_paused(running):
                pid = _kill(running, "relay-queue-writer-0")
                while helpers.alive(pid):
                    await asyncio.sleep(0.05)
                journal = QueueJournal(
                    JournalSettings(root=running.data_dir / "queue-writer-0" / "journal")
                )
                now_ms = int(time.time() * 1000)
                journal.write(
                    r.queue,
                    ids.id_bytes(msg_id),
                    b"stored",
                    ts_ms=now_ms,
                    expires_ms=now_ms + 60_000,
                )
                journal.close()
            frames = await _until(ws, _is_msg(r, msg_id))
            assert [f for f in frames if f.get("type") == "MSG"] == [frames[-1]]
            assert frames[-1]["body"] == Recipient.b64(b"stored")

    asyncio.run(run())
