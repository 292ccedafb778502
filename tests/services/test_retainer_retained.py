"""The retainer's retained host (`relay_retainer.retained`) on a real store in a temporary data
dir: readiness, writes group-committed per round in record order, a refused, full or expired
write failing alone, `match` answers bounded by count and bytes, the expiry sweep, and what was
acknowledged still there after a reopen."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from relay_bus import schemas
from relay_retainer.retained import RetainedHost
from relay_retainer.rounds import Expired
from relay_retainer.settings import RetainedServiceSettings
from relay_runtime.readiness import Readiness
from relay_streams.errors import BadInput
from relay_streams.marks import Mark
from relay_streams.retained import RetainedFull, Write


async def _host(root: Path, readiness: Readiness | None = None, **settings: object) -> RetainedHost:
    host = RetainedHost(
        root, RetainedServiceSettings.model_validate(settings), readiness or Readiness()
    )
    await host.open()
    return host


def _never() -> bool:
    return False


_offsets = itertools.count()


def _next() -> Mark:
    """The log position of the next record (partition 0), as the consumer hands them over."""
    return Mark(0, "e", next(_offsets) + 1)


async def test_writes_share_rounds_in_order_and_fail_alone(tmp_path: Path) -> None:
    readiness = Readiness()
    host = await _host(tmp_path, readiness, max_retained=30, max_payload_bytes=10)
    assert readiness.snapshot() == {"retained": True}
    calls: list[int] = []
    store_many = host.store.store_many

    def counted(
        writes: list[Write], now: int | None = None, positions: list[Mark] | None = None
    ) -> list[bool]:
        calls.append(len(writes))
        return store_many(writes, now, positions)

    host.store.store_many = counted  # type: ignore[method-assign]
    # Writes of one topic in record order: the last one wins, even within one round.
    done = [host.submit(Write(f"t/{i % 25}", f"v{i}".encode()), _next(), _never) for i in range(50)]
    await asyncio.gather(*done)
    assert len(calls) < 50
    last = next(_offsets)  # the next record's offset: every one before it was written
    assert host.store.marks.cut("e", [0, 1]) == {0: last, 1: 0}
    assert (await host.read("t/3")) is not None
    assert (await host.read("t/3")).payload == b"v28"  # type: ignore[union-attr]
    good = host.submit(Write("t/good", b"x"), _next(), _never)
    bad = host.submit(Write("t/bad", b"x" * 11), _next(), _never)  # over max_payload_bytes
    late = host.submit(Write("t/late", b"x"), _next(), lambda: True)
    fill = [host.submit(Write(f"n/{i}", b"x"), _next(), _never) for i in range(10)]
    update = host.submit(
        Write("t/0", b"new"), _next(), _never
    )  # existing topics still update when full
    results = await asyncio.gather(good, bad, late, *fill, update, return_exceptions=True)
    assert results[0] is None
    assert isinstance(results[1], BadInput)
    assert isinstance(results[2], Expired)
    full = [r for r in results[3:-1] if isinstance(r, RetainedFull)]
    assert len(full) == 6  # 25 + good + 4 new topics reach max_retained = 30
    assert results[-1] is None
    assert host.store.size() == 30
    assert host.store.check() == []
    await host.close()
    assert readiness.snapshot() == {"retained": False}
    with pytest.raises(Expired):
        await host.submit(Write("t/after", b"x"), _next(), _never)

    host = await _host(tmp_path)
    assert (await host.read("t/0")).payload == b"new"  # type: ignore[union-attr]
    assert await host.size() == 30
    assert await host.read("t/late") is None
    await host.close()


async def test_match_answers_stop_at_limit_or_bytes_and_say_more(tmp_path: Path) -> None:
    host = await _host(tmp_path, max_reply_bytes=1024)
    await asyncio.gather(
        *(host.submit(Write(f"m/{i:02}", b"p" * 300), _next(), _never) for i in range(10))
    )
    first = await host.match("m/#", None, 4)
    assert [m.topic for m in first.messages] == ["m/00", "m/01", "m/02", "m/03"]
    assert first.more is True
    by_size = await host.match("m/#", None, 100)
    assert len(by_size.messages) == 4  # 4 x 304 bytes reach 1024
    assert by_size.more is True
    rest = await host.match("m/#", "m/07", 100)
    assert [m.topic for m in rest.messages] == ["m/08", "m/09"]
    assert rest.more is False
    keys = await host.topics("m/#", None, 100)  # 4 bytes a topic: all ten fit
    assert keys == schemas.RetainedTopics(
        messages=[schemas.RetainedTopic(topic=f"m/{i:02}") for i in range(10)], more=False
    )
    await host.close()


async def test_the_sweep_clears_expired_messages(tmp_path: Path) -> None:
    host = await _host(tmp_path, clear_interval_s=0.05)
    await host.submit(Write("e/short", b"x", expiry_interval_s=1), _next(), _never)
    await host.submit(Write("e/long", b"x", expiry_interval_s=3600), _next(), _never)
    assert await host.size() == 2
    for _ in range(100):
        if await host.size() == 1:
            break
        await asyncio.sleep(0.05)
    assert await host.size() == 1
    assert await host.read("e/long") is not None
    await host.close()
