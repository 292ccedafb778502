"""Loss and order under SIGKILL (issue 6): concurrent senders over REST and receivers over
WebSocket, acking each message, while every kind of service process and the embedded broker are
killed in turn (relayctl restarts them). Every 201 is recorded, every MSG and every ACK ok.

Checked: every SEND that got 201 is delivered; per queue, first deliveries follow send order;
nothing is delivered again once its ACK was answered ok; and every queue keeps delivering
(all is acked within the drain time; receivers retry a refused ACK, as a client does).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import websockets

from tests import helpers
from tests.api.client import Recipient

pytestmark = pytest.mark.suite

QUEUES = 12
LOAD_S = 40.0
KILL_EVERY_S = 3.0
DRAIN_S = 90.0
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


@dataclass
class Record:
    sent: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """queue -> msg_ids that got 201, in send order."""
    delivered: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    """queue -> (msg_id, when) for every MSG received."""
    acked: dict[str, float] = field(default_factory=dict)
    """msg_id -> when its ACK was answered ok."""
    kills: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    outcomes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


async def _sender(r: Recipient, urls: list[str], record: Record, stop: asyncio.Event) -> None:
    n = 0
    async with httpx.AsyncClient(timeout=15) as http:
        while not stop.is_set():
            body = f"{r.queue}:{n}".encode()
            try:
                response = await http.post(
                    f"{random.choice(urls)}/v1/send/{r.sender}",
                    json={"body": r.b64(body)},
                )
            except httpx.HTTPError as error:
                record.outcomes[r.queue].append(type(error).__name__)
                await asyncio.sleep(0.2)
                continue
            record.outcomes[r.queue].append(str(response.status_code))
            if response.status_code == 201:
                record.sent[r.queue].append(response.json()["msg_id"])
                n += 1
            elif response.status_code == 429:
                await asyncio.sleep(0.5)  # full: the receiver drains it
            else:
                assert response.status_code == 503, response.text
                await asyncio.sleep(0.2)
            await asyncio.sleep(random.uniform(0, 0.05))


async def _receiver(r: Recipient, urls: list[str], record: Record, done: asyncio.Event) -> None:
    """Subscribes (again after END or a lost connection), acks every MSG, and as a client does,
    sends again an ACK whose outcome it did not learn; NO_MSG then means the earlier one
    landed."""
    frames = 0
    unconfirmed: set[str] = set()
    while not done.is_set():
        url = random.choice(urls).replace("http://", "ws://") + "/v1/ws"
        try:
            async with websockets.connect(url, open_timeout=5) as ws:
                frames += 1
                await ws.send(json.dumps(r.sub(f"s{frames}")))
                acks: dict[str, str] = {}

                async def ack(msg_id: str, acks: dict[str, str] = acks) -> None:
                    nonlocal frames
                    frames += 1
                    acks[f"a{frames}"] = msg_id
                    unconfirmed.add(msg_id)
                    await ws.send(json.dumps(r.ack(msg_id, f"a{frames}")))

                while not done.is_set():
                    try:
                        frame = json.loads(await asyncio.wait_for(ws.recv(), 1.0))
                    except TimeoutError:
                        continue
                    reply_to = acks.pop(frame.get("id"), None) if "ok" in frame else None
                    if frame.get("type") == "MSG":
                        record.delivered[r.queue].append((frame["msg_id"], time.monotonic()))
                        await ack(frame["msg_id"])
                    elif frame.get("type") == "END":
                        break  # taken over: subscribe again
                    elif reply_to is not None and (frame["ok"] or frame["error"] == "NO_MSG"):
                        unconfirmed.discard(reply_to)
                        if frame["ok"] or reply_to not in record.acked:
                            record.acked.setdefault(reply_to, time.monotonic())
                    elif reply_to is not None:
                        await asyncio.sleep(0.3)  # a queue-writer restarting: again
                        await ack(reply_to)
                    elif frame.get("ok") is True and str(frame["id"]).startswith("s"):
                        for msg_id in list(unconfirmed):
                            await ack(msg_id)
                    elif frame.get("ok") is False and str(frame.get("id", "")).startswith("s"):
                        await asyncio.sleep(0.3)
                        break  # the SUB failed (a service restarting): again
        except (OSError, websockets.exceptions.WebSocketException, TimeoutError):
            await asyncio.sleep(0.3)


async def _killer(running: helpers.Running, record: Record, stop: asyncio.Event) -> None:
    victims = list(VICTIMS)
    while not stop.is_set():
        await asyncio.sleep(KILL_EVERY_S)
        if stop.is_set() or not victims:
            return
        name = victims.pop(0)
        child = next(c for c in running.state.children if c.name == name)
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        record.kills.append(name)


def _unsettled(record: Record) -> list[tuple[str, int]]:
    """(queue, index) of sent messages neither acked ok nor passed: with one message in flight
    per queue, a later message delivered means this one was acknowledged at the server (its
    ACK's answer was lost in a kill, or the connection died with it)."""
    unsettled = []
    for queue, msg_ids in record.sent.items():
        delivered = {m for m, _ in record.delivered[queue]}
        passed = False
        for index in reversed(range(len(msg_ids))):
            msg_id = msg_ids[index]
            if not passed and msg_id not in record.acked:
                unsettled.append((queue, index))
            passed = passed or msg_id in delivered
    return unsettled


def test_nothing_acknowledged_is_lost_under_kills(tmp_path: Path) -> None:
    args = ["--port", "0", "--ingress", "2", "--queue-writers", "2", "--delivery", "2"]
    with helpers.suite(tmp_path, *args) as running:
        urls = running.ingress_urls()
        with httpx.Client(base_url=urls[0], timeout=20) as http:
            recipients = [Recipient(http).create() for _ in range(QUEUES)]
        record = Record()

        async def main() -> None:
            stop, done = asyncio.Event(), asyncio.Event()
            receivers = [asyncio.create_task(_receiver(r, urls, record, done)) for r in recipients]
            senders = [asyncio.create_task(_sender(r, urls, record, stop)) for r in recipients]
            killer = asyncio.create_task(_killer(running, record, stop))
            await asyncio.sleep(LOAD_S)
            stop.set()
            await asyncio.gather(*senders, killer)
            deadline = time.monotonic() + DRAIN_S
            while _unsettled(record) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            record.drain_s = DRAIN_S - (deadline - time.monotonic())
            done.set()
            await asyncio.gather(*receivers)

        asyncio.run(main())

    sent = sum(len(q) for q in record.sent.values())
    deliveries = sum(len(q) for q in record.delivered.values())
    print(  # the figures, for the issue note (pytest -s)
        f"sent {sent}, deliveries {deliveries} ({deliveries - len(record.acked)} again before"
        f" an ACK ok), kills {len(record.kills)}, drained in {record.drain_s:.1f} s"
    )
    assert record.kills == VICTIMS
    assert sent > 100, f"only {sent} sends succeeded"
    delivered = {m for q in record.delivered.values() for m, _ in q}
    lost = [m for q in record.sent.values() for m in q if m not in delivered]
    assert not lost, f"{len(lost)} of {sent} acknowledged sends never delivered"
    stuck = _unsettled(record)
    assert not stuck, f"queues stopped delivering at (queue, index): {stuck}" + str(
        [(q[:6], record.outcomes[q][-8:], len(record.outcomes[q])) for q, _ in stuck]
    )
    for queue, msg_ids in record.sent.items():
        first: list[str] = []
        for msg_id, _ in record.delivered[queue]:
            if msg_id not in first:
                first.append(msg_id)
        in_order = [m for m in first if m in set(msg_ids)]
        assert in_order == msg_ids, f"queue {queue} delivered out of order"
    again = [
        (m, when - record.acked[m])
        for q in record.delivered.values()
        for m, when in q
        if m in record.acked and when > record.acked[m]
    ]
    assert not again, f"delivered again after an ACK ok: {again[:5]}"
