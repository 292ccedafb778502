"""Batched calls to one peer's item endpoint (`/internal/kv/write`, `/internal/kv/read`): the
items asked while a call to that peer is in flight leave together in the next call, so N
concurrent quorum rounds cost the peer about one request and one group commit, not N.

Invariants:
- each group of items (one caller's) is sent exactly once, in one call, and its caller gets
  exactly its own answers, in its order, or the call's error (`PeerError`, `TimeoutError`);
- one call per (peer, path) is in flight at a time; a call carries whole groups up to
  `MAX_CALL_BYTES` of items (a larger group goes alone), further groups go in concurrent calls
  of the same batch;
- a call is bounded by `timeout_s`: a stalled peer holds its queue at most that long, and the
  caller's own budget still applies (a caller that gave up is not answered; its items may still
  have been sent, which every item endpoint takes as idempotent).
"""

from __future__ import annotations

import asyncio
from typing import Any

from relay_durable.batching import BatchLoop
from relay_replicator.peers import PeerError, Peers

MAX_CALL_BYTES = 1 << 20
"""Items per call, in bytes of JSON (well under the servers' request limit, 4 MiB by default)."""


class _Group:
    __slots__ = ("future", "items", "size")

    def __init__(self, items: list[str], future: asyncio.Future[list[Any]]) -> None:
        self.items = items
        self.future = future
        self.size = sum(len(i) for i in items)


class PeerCalls:
    """Batched calls to `path` of every peer; answers are the response's `answers` list."""

    def __init__(self, peers: Peers, path: str, answers: str, timeout_s: float) -> None:
        self.peers = peers
        self.path = path
        self.answers = answers
        self.timeout_s = timeout_s
        self._loops: dict[str, BatchLoop[_Group]] = {}
        self.calls = 0
        """HTTP calls made so far (to every peer)."""

    async def ask(self, site: str, items: list[str]) -> list[Any]:
        """Send `items` (each one JSON object, already encoded) to `site`; their answers."""
        loop = self._loops.get(site)
        if loop is None:
            loop = self._loops[site] = BatchLoop(
                lambda groups: self._call_all(site, groups), f"kv-peer-{site}{self.path}"
            )
            loop.start()
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not loop.put(_Group(items, future)):
            raise RuntimeError("peer calls are closed")
        return await future

    async def close(self) -> None:
        for loop in self._loops.values():
            await loop.close()

    async def _call_all(self, site: str, groups: list[_Group]) -> None:
        calls: list[list[_Group]] = [[]]
        size = 0
        for group in groups:
            if calls[-1] and size + group.size > MAX_CALL_BYTES:
                calls.append([])
                size = 0
            calls[-1].append(group)
            size += group.size
        await asyncio.gather(*(self._call(site, call) for call in calls))

    async def _call(self, site: str, groups: list[_Group]) -> None:
        body = '{"items":[' + ",".join(i for g in groups for i in g.items) + "]}"
        self.calls += 1
        try:
            answer = await asyncio.wait_for(
                self.peers.call(site, self.path, body.encode()), self.timeout_s
            )
            answers: list[Any] = answer[self.answers]
            if len(answers) != sum(len(g.items) for g in groups):
                raise PeerError(f"{site}: answered {len(answers)} items")
        except (PeerError, TimeoutError) as error:
            self._fail(groups, error)
            return
        except Exception as error:  # a malformed answer: every waiter learns why
            self._fail(groups, PeerError(f"{site}: bad answer: {error!r}"))
            return
        start = 0
        for group in groups:
            end = start + len(group.items)
            if not group.future.done():
                group.future.set_result(answers[start:end])
            start = end

    @staticmethod
    def _fail(groups: list[_Group], error: Exception) -> None:
        for group in groups:
            if not group.future.done():
                group.future.set_exception(error)
