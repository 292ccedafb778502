"""Hinted handoff, the fallback's side: hand the hints this site keeps back to their targets.

Every `interval_s`, for each target this site holds hints for: probe it (unless known up); when
it answers, send its hints in batches of `batch` keys, one batch at a time (the target's fsynced
answer paces the replay), and delete each hint only if it is still the bytes that were sent (a
hint merged with a newer write meanwhile stays for the next round). Hints older than the age
limit are dropped without sending: anti-entropy repairs what they carried.

Invariant: a hint is deleted only after its target acknowledged a write carrying it (or it
expired); a target that fails mid-replay keeps the rest for the next round.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from prometheus_client import Counter

from relay_replicator.coordinator import Replicas
from relay_replicator.peers import PeerError
from relay_replicator.periodic import Periodic
from relay_replicator.replica import Refused

log = structlog.get_logger(__name__)

_REPLAYED = Counter("relay_kv_hints_replayed_total", "Hints handed back to their target")
_EXPIRED = Counter("relay_kv_hints_expired_total", "Hints dropped past their age limit")


class Handoff:
    def __init__(
        self, replicas: Replicas, now_ms: Callable[[], int], interval_s: float, batch: int = 100
    ) -> None:
        self.replicas = replicas
        self.store = replicas.local.store
        self.peers = replicas.peers
        self.now_ms = now_ms
        self.interval_s = interval_s
        self.batch = batch
        self._rounds = Periodic("kv-handoff", interval_s, self.replay_all)

    def start(self) -> None:
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    async def replay_all(self) -> int:
        """One round over every target; returns the hints handed back."""
        handed = 0
        for target in sorted(self.store.hint_targets()):
            if target not in self.peers.sites and target != self.peers.me:
                continue
            if self.peers.is_down(target) and not await self.peers.probe(target):
                continue
            handed += await self.replay(target)
        return handed

    async def replay(self, target: str) -> int:
        handed = 0
        while True:
            found = self.store.hints_for(target, self.batch)
            if not found:
                return handed
            now = self.now_ms()
            expired = [(k, raw) for k, raw, h in found if h.expired(now, self.store.hint_limits)]
            live = [
                (k, raw, h) for k, raw, h in found if not h.expired(now, self.store.hint_limits)
            ]
            if expired:
                _EXPIRED.inc(len(expired))
                await self.store.drop_hints(expired)
            if live:
                items = [(h.n, h.namespace, h.key, h.value) for _, _, h in live]
                try:
                    await self.replicas.write(target, items)
                except (PeerError, Refused, TimeoutError) as error:
                    log.info("kv_handoff_paused", target=target, error=str(error))
                    return handed
                await self.store.drop_hints([(k, raw) for k, raw, _ in live])
                _REPLAYED.inc(len(live))
                handed += len(live)
            if len(found) < self.batch:
                return handed
