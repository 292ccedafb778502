"""Load with loss and order checks, shared by the kill tests: senders over REST and receivers
over WebSocket acking every message, while a test's own disruption runs.

Checked by `check`: every SEND that got 201 is delivered; per queue, first deliveries follow send
order; nothing is delivered again once its ACK was answered ok; and every queue keeps delivering
(all is acked within the drain time; receivers retry a refused ACK, as a client does).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import websockets

from tests import helpers
from tests.api.client import Recipient

DRAIN_S = 90.0


@dataclass
class Record:
    sent: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """queue -> msg_ids that got 201, in send order."""
    delivered: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    """queue -> (msg_id, when) for every MSG received."""
    acked: dict[str, float] = field(default_factory=dict)
    """msg_id -> when its ACK was answered ok."""
    stored_at: list[float] = field(default_factory=list)
    """When each 201 arrived (monotonic), for measuring how long writes stalled."""
    kills: list[str] = field(default_factory=list)
    drain_s: float = 0.0
    outcomes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


async def sender(r: Recipient, urls: list[str], record: Record, stop: asyncio.Event) -> None:
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
                record.stored_at.append(time.monotonic())
                n += 1
            elif response.status_code == 429:
                await asyncio.sleep(0.5)  # full: the receiver drains it
            else:
                assert response.status_code == 503, response.text
                await asyncio.sleep(0.2)
            await asyncio.sleep(random.uniform(0, 0.05))


async def receiver(r: Recipient, urls: list[str], record: Record, done: asyncio.Event) -> None:
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


def unsettled(record: Record) -> list[tuple[str, int]]:
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


def stall_after(record: Record, since: float, window_s: float = 20.0) -> float:
    """The longest time without any 201 in the `window_s` after `since` (a kill)."""
    times = [since, *sorted(t for t in record.stored_at if since < t < since + window_s)]
    return max(b - a for a, b in itertools.pairwise(times)) if len(times) > 1 else window_s


def run(
    running: helpers.Running,
    queues: int,
    disrupt: Callable[[Record], Awaitable[None]],
    recover_s: float,
) -> Record:
    """`queues` senders and receivers through every ingress while `disrupt` runs and for
    `recover_s` after it returns, then drain up to `DRAIN_S`. The load lasts as long as the
    disruption does, however slowly a loaded machine runs its schedule."""
    urls = running.ingress_urls()
    with httpx.Client(base_url=urls[0], timeout=20) as http:
        recipients = [Recipient(http).create() for _ in range(queues)]
    record = Record()

    async def main() -> None:
        stop, done = asyncio.Event(), asyncio.Event()
        receivers = [asyncio.create_task(receiver(r, urls, record, done)) for r in recipients]
        senders = [asyncio.create_task(sender(r, urls, record, stop)) for r in recipients]
        await disrupt(record)
        await asyncio.sleep(recover_s)
        stop.set()
        await asyncio.gather(*senders)
        deadline = time.monotonic() + DRAIN_S
        while unsettled(record) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        record.drain_s = DRAIN_S - (deadline - time.monotonic())
        done.set()
        await asyncio.gather(*receivers)

    asyncio.run(main())
    return record


def check(record: Record) -> None:
    sent = sum(len(q) for q in record.sent.values())
    deliveries = sum(len(q) for q in record.delivered.values())
    print(  # the figures, for the issue note (pytest -s)
        f"sent {sent}, deliveries {deliveries} ({deliveries - len(record.acked)} again before"
        f" an ACK ok), kills {len(record.kills)}, drained in {record.drain_s:.1f} s"
    )
    assert sent > 100, f"only {sent} sends succeeded"
    delivered = {m for q in record.delivered.values() for m, _ in q}
    lost = [m for q in record.sent.values() for m in q if m not in delivered]
    assert not lost, f"{len(lost)} of {sent} acknowledged sends never delivered"
    stuck = unsettled(record)
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
