"""The retainer's stream host (`relay_retainer.streams`) on a real store in a temporary data
dir: readiness, databases opened at start, writes batched per round, a refused or expired
request failing alone, and what was acknowledged still there after a reopen."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from relay_retainer.rounds import Expired
from relay_retainer.settings import StreamSettings
from relay_retainer.streams import StreamHost
from relay_runtime.readiness import Readiness
from relay_streams.errors import BadInput, NotFound
from relay_streams.marks import Mark
from relay_streams.model import Message


async def _host(root: Path, readiness: Readiness, **settings: object) -> StreamHost:
    host = StreamHost(root, "retainer-0", StreamSettings.model_validate(settings), readiness)
    await host.open()
    return host


def _never() -> bool:
    return False


_offsets = itertools.count()


def _next() -> Mark:
    """The log position of the next record (partition 0), as the consumer hands them over."""
    return Mark(0, "e", next(_offsets) + 1)


async def test_writes_share_rounds_and_fail_alone(tmp_path: Path) -> None:
    readiness = Readiness()
    host = await _host(tmp_path, readiness, databases=["messages", "other"], shards=2)
    assert readiness.snapshot() == {"streams": True}
    assert host.store.storages() == ["messages", "other"]
    calls: list[int] = []
    store_batch = host.store.store_batch

    def counted(
        db: str, messages: list[Message], sync: bool = True, marks: list[Mark] | None = None
    ) -> None:
        calls.append(len(messages))
        store_batch(db, messages, sync, marks)

    host.store.store_batch = counted  # type: ignore[method-assign]
    writes = [host.store_batch("messages", [(f"t/{i}", b"x")], _next(), _never) for i in range(50)]
    assert await asyncio.gather(*writes) == [None] * 50
    assert len(calls) < 50  # requests that wait together share one store_batch
    last = next(_offsets)  # the next record's offset: each shard marks its last write's
    cuts = [marks.cut("e", [0])[0] for marks in host.store.db("messages").marks()]
    assert max(cuts) == last
    assert min(cuts) > 0  # both shards took writes
    good = host.store_batch("messages", [("t/good", b"x")], _next(), _never)
    bad = host.store_batch("messages", [Message("t/bad", b"x", -1)], _next(), _never)
    late = host.store_batch("messages", [("t/late", b"x")], _next(), lambda: True)
    results = await asyncio.gather(good, bad, late, return_exceptions=True)
    assert results[0] is None
    assert isinstance(results[1], BadInput)
    assert isinstance(results[2], Expired)
    with pytest.raises(NotFound):
        await host.store_batch("nosuchdb", [("t", b"x")], _next(), _never)
    await host.close()
    assert readiness.snapshot() == {"streams": False}

    host = await _host(tmp_path, Readiness())
    assert host.store.storages() == ["messages", "other"]  # on disk: opened again
    for topic, count in (("t/7", 1), ("t/good", 1), ("t/late", 0), ("t/bad", 0)):
        found = []
        for ranked in await host.get_streams("messages", topic, 0):
            it = await host.make_iterator("messages", ranked.stream.token(), topic, 0)
            found += (await host.next("messages", it.token(), 10)).messages
        assert [m.topic for m in found] == [topic] * count
    await host.close()
