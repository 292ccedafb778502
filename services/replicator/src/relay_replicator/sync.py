"""Anti-entropy: pairs of replicas compare tictac hashes and exchange what differs; then the
tombstones that every replica is known to hold are purged.

Every `interval_s`, for each replication factor n this site stores and each peer: the shards the
two share (both among the n home replicas) are compared group by group (XOR of shard hashes per
group), then shard by shard in the groups that differ, then key by key in the shards that differ
(`shards_per_call` shards per listing, listed a page of `keys_per_call` keys at a time, each
page compared with this site's keys of the same range, so a very large shard costs pages, not
one answer holding every key). A differing key is pulled (the peer's value merged
here) and pushed (the merge written to the peer): both then hold the join. A pass that compared
every shared shard records when it started (`KvStore.mark_synced`); a shard is synced as of the
oldest such time among its other home replicas, which the GC guard
(`relay_kv.tombstones.purgeable`) requires.

After the exchanges, a pass hands back what this site holds of shards it no longer homes (a
view change took it out of their home sets): each such key is written to the shard's home
replicas, then forgotten here once every one of them took it (`hand_back`). The joiners' pull
merged a read quorum of the old home replicas, so this carries what was on the others only:
writes made with a W below the majority, and writes to a replica that was down during the
pull.

Invariants: anti-entropy only ever merges (never overwrites or deletes a value), and never
hands over a tombstone this site would purge; one pass at a time; a pass interrupted by a
peer's failure records nothing, so the guard never counts a sync that did not complete; keys
are exchanged in batches of `batch` (the throttle: one read and one write call per batch).
A hand-back runs only while no view change is under way (a joiner's pulled shards are not in
its home sets until the change ends), deletes a key here only if it is still what was handed
back, and hands back only values updated within their namespace's `gc_grace`: an older one
may have been deleted at its home since and the tombstone purged, so handing it back could
bring it back (Cassandra's resurrection); such a value stays here, unread, as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import structlog
from prometheus_client import Counter, Gauge

from relay_kv import codec, crdt, names, placement, setrows, tictac, tombstones
from relay_replicator.coordinator import NS_N, Replicas
from relay_replicator.peers import PeerError
from relay_replicator.periodic import Periodic
from relay_replicator.replica import Refused
from relay_replicator.store import Write

log = structlog.get_logger(__name__)

_DIVERGENT = Gauge("relay_kv_divergent_shards", "Shards that differed in the last pass", ["peer"])
_EXCHANGED = Counter("relay_kv_sync_keys_total", "Keys exchanged by anti-entropy", ["way"])
_PURGED = Counter("relay_kv_tombstones_purged_total", "Tombstones purged by GC")


class Sync:
    def __init__(
        self,
        replicas: Replicas,
        now_ms: Callable[[], int],
        interval_s: float,
        *,
        gc_guard: bool = True,
        batch: int = 500,
        shards_per_call: int = 1024,
        keys_per_call: int = 10_000,
    ) -> None:
        self.replicas = replicas
        self.store = replicas.local.store
        self.peers = replicas.peers
        self.now_ms = now_ms
        self.interval_s = interval_s
        self.gc_guard = gc_guard
        self.batch = batch
        self.shards_per_call = shards_per_call
        self.keys_per_call = keys_per_call
        """Rows of a peer's key listing per call (a large shard is listed in pages)."""
        self._home: dict[tuple[int, int], tuple[str, ...]] = {}
        self._home_view = 0
        self._groups: dict[tuple[int, str], tuple[tictac.Tree, tuple[int, int], dict[str, Any]]]
        self._groups = {}
        self.passes = 0
        self._rounds = Periodic("kv-sync", interval_s, self.run_pass)

    def start(self) -> None:
        if self.interval_s > 0:
            self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    # -- what a peer asks --------------------------------------------------------------------

    def home(self, n: int, shard: int) -> tuple[str, ...]:
        """The shard's home replicas in the current view (memoised per view)."""
        view = self.peers.view
        if self._home_view != view.version:
            self._home, self._home_view = {}, view.version
        key = (n, shard)
        found = self._home.get(key)
        if found is None:
            found = self._home[key] = view.replicas(shard, n).home
        return found

    def shared(self, n: int, peer: str, shards: Iterable[int]) -> list[int]:
        """Those of `shards` whose n home replicas include this site and `peer`. Only shards
        holding data are ever asked about (an empty shard adds nothing to a group's XOR), so
        the cost follows the data, not the 65,536 shards."""
        me = self.peers.me
        return [s for s in shards if me in (home := self.home(n, s)) and peer in home]

    def _tree(self, n: int) -> tictac.Tree:
        return self.store.tree.get(n) or tictac.Tree()

    def groups(self, n: int, peer: str) -> dict[str, Any]:
        """The group hashes of the shards shared with `peer`, recomputed only when the tree or
        the view changed since the last time (at rest a pass costs two small calls per peer,
        not a walk of every shard holding data)."""
        tree = self._tree(n)
        stamp = (tree.changes, self.peers.view.version)
        known = self._groups.get((n, peer))
        if known is not None and known[0] is tree and known[1] == stamp:
            return known[2]
        hashes = tree.groups(self.shared(n, peer, list(tree.shards)))
        answer = {"groups": {str(g): f"{h:016x}" for g, h in hashes.items()}}
        self._groups[(n, peer)] = (tree, stamp, answer)
        return answer

    def shards(self, n: int, peer: str, groups: list[int]) -> dict[str, Any]:
        wanted = set(groups)
        tree = self._tree(n)
        return {
            "shards": {
                str(s): f"{tree.shard(s):016x}"
                for s in self.shared(n, peer, list(tree.shards))
                if tictac.group_of(s) in wanted
            }
        }

    def keys(
        self,
        n: int,
        shards: list[int],
        after: tuple[int, str, str] | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The keys of `shards` after `after` (shard, namespace, key) with their hashes, as
        [shard, namespace, key, hash] rows in (shard, namespace, key) order: at most `limit`,
        with `more` when some are left (the next page starts after the last row)."""
        rows = self._rows(n, shards, after)
        page = list(itertools.islice(rows, limit)) if limit is not None else list(rows)
        more = limit is not None and next(rows, None) is not None
        return {"keys": [list(row) for row in page], "more": more}

    def _rows(
        self, n: int, shards: list[int], after: tuple[int, str, str] | None = None
    ) -> Iterator[tuple[int, str, str, str]]:
        for shard in sorted(shards):
            if after is not None and shard < after[0]:
                continue
            resume = after[1:] if after is not None and shard == after[0] else None
            for ns, key, raw in self.store.shard_keys(n, shard, resume):  # sought, not walked
                yield shard, ns, key, f"{tictac.key_hash(ns, key, raw):016x}"

    # -- one pass ------------------------------------------------------------------------------

    async def run_pass(self) -> dict[str, int]:
        """Exchange with every peer for every n, then GC; returns the divergent shards per peer."""
        divergent: dict[str, int] = {}
        classes = sorted({*self.store.tree, NS_N})
        for peer in sorted(self.peers.sites):
            if self.peers.is_down(peer) and not await self.peers.probe(peer):
                continue
            for n in classes:
                started = self.now_ms()
                try:
                    found = await self.exchange(peer, n)
                except (PeerError, Refused, TimeoutError) as error:
                    log.info("kv_sync_interrupted", peer=peer, n=n, error=str(error))
                    break
                divergent[peer] = divergent.get(peer, 0) + found
                await self.store.mark_synced(n, peer, started)
            _DIVERGENT.labels(peer).set(divergent.get(peer, 0))
        await self.hand_back()
        await self.collect_garbage()
        self.passes += 1
        return divergent

    async def exchange(self, peer: str, n: int) -> int:
        """Compare and repair every shard shared with `peer` for `n`; returns shards that
        differed."""
        me = self.peers.me
        theirs = await self.peers.call(peer, "/internal/kv/tree/groups", {"n": n, "peer": me})
        mine = self.groups(n, peer)["groups"]
        groups = tictac.differing(mine, theirs["groups"])
        if not groups:
            return 0
        their_shards = (
            await self.peers.call(
                peer, "/internal/kv/tree/shards", {"n": n, "peer": me, "groups": groups}
            )
        )["shards"]
        my_shards = self.shards(n, peer, groups)["shards"]
        differing = tictac.differing(my_shards, their_shards)
        for start in range(0, len(differing), self.shards_per_call):
            await self.repair_shards(peer, n, differing[start : start + self.shards_per_call])
        return len(differing)

    async def repair_shards(
        self, peer: str, n: int, shards: list[int], *, push: bool = True
    ) -> None:
        """Make this site and `peer` hold the join of every key of `shards`: the peer's keys
        listed a page of `keys_per_call` at a time, each page compared with this site's keys
        of the same range, then pulls and pushes `batch` keys at a time (without `push`, only
        pulls: this site then holds the join, the peer is left as it was)."""
        after: tuple[int, str, str] | None = None
        while True:
            asked: dict[str, Any] = {"n": n, "shards": shards, "limit": self.keys_per_call}
            if after is not None:
                asked["after"] = list(after)
            answer = await self.peers.call(peer, "/internal/kv/tree/keys", asked)
            listed = answer["keys"]
            # A peer of the version before paging lists everything at once, without `more`.
            last = listed[-1] if answer.get("more") else None
            upto = None if last is None else (int(last[0]), str(last[1]), str(last[2]))
            their_keys = {(shard, ns, key): h for shard, ns, key, h in listed}
            my_keys: dict[tuple[int, str, str], str] = {}
            for shard, ns, key, h in self._rows(n, shards, after):
                if upto is not None and (shard, ns, key) > upto:
                    break
                my_keys[(shard, ns, key)] = h
            await self._repair_keys(peer, n, their_keys, my_keys, push)
            if upto is None:
                return
            after = upto

    async def _repair_keys(
        self,
        peer: str,
        n: int,
        their_keys: dict[tuple[int, str, str], str],
        my_keys: dict[tuple[int, str, str], str],
        push: bool,
    ) -> None:
        differ = sorted(
            k for k in set(my_keys) | set(their_keys) if my_keys.get(k) != their_keys.get(k)
        )
        for start in range(0, len(differ), self.batch):
            part = differ[start : start + self.batch]
            pull = [k for k in part if k in their_keys]
            if pull:
                values = await self.replicas.read(peer, [(n, ns, key) for _, ns, key in pull])
                got = [
                    (n, ns, key, v)
                    for (shard, ns, key), v in zip(pull, values, strict=True)
                    if v is not None and not self.purgeable(n, shard, ns, key, v)
                ]
                if got:
                    await self.replicas.local.write(got)
                    _EXCHANGED.labels("pulled").inc(len(got))
            if not push:
                continue
            pushed = [
                (n, ns, key, value)
                for shard, ns, key in part
                if (value := self.store.get(n, shard, ns, key)) is not None
                and not self.purgeable(n, shard, ns, key, value)
            ]
            if pushed:
                await self.replicas.write(peer, pushed)
                _EXCHANGED.labels("pushed").inc(len(pushed))

    # -- hand-back ---------------------------------------------------------------------------

    async def hand_back(self) -> int:
        """Write what this site holds of shards it does not home to their home replicas, and
        forget each key once all of them took it; returns the keys forgotten."""
        if self.peers.change is not None:
            return 0
        me = self.peers.me
        handed = 0
        for n in sorted(self.store.tree):
            foreign = sorted(s for s in self.store.tree[n].shards if me not in self.home(n, s))
            for start in range(0, len(foreign), self.shards_per_call):
                handed += await self._hand_back(n, foreign[start : start + self.shards_per_call])
        return handed

    async def _hand_back(self, n: int, shards: list[int]) -> int:
        now = self.now_ms()
        # A shard with a home replica known down waits for a later pass (written to none).
        shards = [s for s in shards if not any(map(self.peers.is_down, self.home(n, s)))]
        rows = []
        for shard in shards:
            for namespace, key, raw in self.store.shard_keys(n, shard):
                value = codec.decode(raw)
                if value.updated.wall_ms > now - self._grace_ms(namespace):
                    rows.append((Write(n, shard, namespace, key, value), raw))
        failed: set[int] = set()
        for peer in sorted({site for shard in shards for site in self.home(n, shard)}):
            theirs = [
                (n, w.namespace, w.key, w.value) for w, _ in rows if peer in self.home(n, w.shard)
            ]
            try:
                for start in range(0, len(theirs), self.batch):
                    await self.replicas.write(peer, theirs[start : start + self.batch])
            except (PeerError, Refused, TimeoutError) as error:
                log.info("kv_hand_back_interrupted", peer=peer, n=n, error=str(error))
                failed.update(s for s in shards if peer in self.home(n, s))
        done = [(w, raw) for w, raw in rows if w.shard not in failed]
        if done:
            await self.store.purge(done)
            _EXCHANGED.labels("handed_back").inc(len(done))
        return len(done)

    # -- garbage collection ------------------------------------------------------------------

    def synced_ms(self, n: int, shard: int) -> int | None:
        """When the shard was last fully synced with all its other home replicas (None: not
        yet with some of them)."""
        others = [s for s in self.peers.view.replicas(shard, n).home if s != self.peers.me]
        times = [self.store.synced.get((n, peer)) for peer in others]
        if any(t is None for t in times):
            return None
        return min([t for t in times if t is not None], default=self.now_ms())

    def _grace_ms(self, namespace: str) -> int:
        if namespace == names.NAMESPACES:
            return 864_000_000
        shard = placement.shard_of(names.NAMESPACES, namespace)
        found = self.store.get(NS_N, shard, names.NAMESPACES, namespace)
        if isinstance(found, crdt.Register) and found.value is not None:
            return names.Namespace.decode(found.value).gc_grace_s * 1000
        return 864_000_000

    def purgeable(self, n: int, shard: int, namespace: str, key: str, value: crdt.Value) -> bool:
        """Whether this site would purge `value`: such a tombstone is neither pulled nor pushed
        (otherwise replicas that purge at different moments hand it back and forth forever). A
        set's head outlives its member rows here: it marks the key as a set while any remains
        (`relay_kv.setrows`)."""
        now = self.now_ms()
        if tombstones.tombstone_since(value, now) is None:
            return False
        if not tombstones.purgeable(
            value, now, self._grace_ms(namespace), self.synced_ms(n, shard), guard=self.gc_guard
        ):
            return False
        if isinstance(value, crdt.AWSet) and not setrows.is_row(key):
            return not self.store.rows(n, namespace, key, None, 1)[0]
        return True

    async def collect_garbage(self) -> int:
        judged = []
        for n, shard, namespace, key, raw in self.store.mortal_keys():
            value = codec.decode(raw)
            if self.purgeable(n, shard, namespace, key, value):
                judged.append((Write(n, shard, namespace, key, value), raw))
        if judged:
            await self.store.purge(judged)
            _PURGED.inc(len(judged))
        return len(judged)
