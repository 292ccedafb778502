"""The replicator's store: one RocksDB instance (`rocksdict`) under `<data dir>/kv/db`.

Layout (`kv/1`, recorded under `META`):
- `d` n shard(2) namespace NUL key -> the value's envelope (`relay_kv.codec`); `n` is the
  namespace's replication factor, so that the keys two sites share for one `n` are ranges of
  shards (anti-entropy compares them that way); a set's member rows are keys too (key NUL
  hex(member), `relay_kv.setrows`), in the set's shard, right after its head;
- `h` n shard(2) -> the shard's tictac hash (8 bytes, `relay_kv.tictac`);
- `i` target NUL namespace NUL key -> a hint for `target` (`relay_kv.hints`);
- `s` n peer -> when the last complete anti-entropy pass with `peer` for that `n` started (ms);
- `g` n shard(2) namespace NUL key -> empty: the key's value is mortal (a tombstone, or one by
  expiry: `relay_kv.tombstones.mortal`), so garbage collection reads these keys only, not every
  key (a store written before this index builds it once at open, `META` `gc_index`).

Invariants:
- every change goes through one group-committed `WriteBatch` written with `sync=True`: a write
  is acknowledged (its future resolved) only after the batch holding it is on disk, and a key's
  value and its shard's hash change in the same batch, so the hashes are never out of step with
  the data, even after a crash (`check()` recomputes them); the same holds for the GC index;
- a write merges (`relay_kv.crdt.merge`) into what is stored: applying the same write twice, or
  an older one after a newer one, changes nothing;
- decisions: RocksDB rather than SQLite or an append-only log of our own because range scans per
  shard, write batches and a proven engine are what is needed (decision 0011); `rocksdict` holds
  the GIL during a write and its fsync, so writes are group-committed (`BatchLoop`): N concurrent
  writes cost one fsync and one stall of the event loop.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from rocksdict import Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from relay_durable.batching import BatchLoop
from relay_kv import codec, crdt, hints, placement, setrows, tictac, tombstones
from relay_kv.clock import Version

log = structlog.get_logger(__name__)

META = b"\x00meta"
LAYOUT = "kv/1"
DATA = b"d"
HASH = b"h"
HINT = b"i"
SYNCED = b"s"
MORTAL = b"g"
_U64 = struct.Struct(">Q")
_SYNC = WriteOptions()
_SYNC.sync = True


def data_key(n: int, shard: int, namespace: str, key: str) -> bytes:
    return DATA + bytes([n]) + shard.to_bytes(2, "big") + namespace.encode() + b"\0" + key.encode()


def _after(prefix: bytes) -> bytes | None:
    """The least key above every key that starts with `prefix` (None: there is none)."""
    kept = prefix.rstrip(b"\xff")
    return kept[:-1] + bytes([kept[-1] + 1]) if kept else None


def _hash_key(n: int, shard: int) -> bytes:
    return HASH + bytes([n]) + shard.to_bytes(2, "big")


@dataclass(frozen=True)
class Write:
    n: int
    shard: int
    namespace: str
    key: str
    value: crdt.Value


@dataclass(frozen=True)
class Applied:
    stored: crdt.Value
    """The value now stored (the merge)."""
    newer: Version | None
    """For a last-writer-wins write that lost: the stored version that beat it."""


@dataclass
class _Job:
    writes: list[Write] = field(default_factory=list)
    hints: list[hints.Hint] = field(default_factory=list)
    drop_hints: list[tuple[bytes, bytes]] = field(default_factory=list)
    """(storage key, the bytes read): deleted only if still those bytes."""
    purges: list[tuple[Write, bytes]] = field(default_factory=list)
    """(key, the envelope judged purgeable): deleted only if still that envelope."""
    synced: list[tuple[int, str, int]] = field(default_factory=list)
    future: asyncio.Future[list[Applied]] | None = None


class KvStore:
    def __init__(self, path: Path, hint_limits: hints.HintLimits) -> None:
        self.path = path
        self.hint_limits = hint_limits
        self.tree: dict[int, tictac.Tree] = {}
        """n -> shard hashes (in memory, persisted beside the data)."""
        self.hint_bytes = 0
        self.synced: dict[tuple[int, str], int] = {}
        self.db: Rdict | None = None
        self._loop: BatchLoop[_Job] = BatchLoop(self._commit, "kv-commit")

    # -- life --------------------------------------------------------------------------------

    def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(str(self.path), options)
        meta = self.db.get(META)
        if meta is None:
            self.db.put(META, json.dumps({"v": 1, "layout": LAYOUT, "gc_index": 1}).encode(), _SYNC)
        elif json.loads(meta).get("layout") != LAYOUT:
            raise codec.CorruptValue(f"{self.path}: unknown layout {meta!r}")
        elif not json.loads(meta).get("gc_index"):
            self._build_gc_index(json.loads(meta))
        for key, value in self._range(HASH):
            self.tree.setdefault(key[1], tictac.Tree()).shards[int.from_bytes(key[2:4], "big")] = (
                _U64.unpack(value)[0]
            )
        self.hint_bytes = sum(len(k) + len(v) for k, v in self._range(HINT))
        for key, value in self._range(SYNCED):
            self.synced[(key[1], key[2:].decode())] = _U64.unpack(value)[0]
        self._loop.start()

    def _build_gc_index(self, meta: dict[str, object]) -> None:
        """Index the mortal values of a store written before the index existed, and record
        that it exists, in one synced batch."""
        assert self.db is not None
        batch = WriteBatch(raw_mode=True)
        indexed = 0
        for raw_key, value in self._range(DATA):
            if tombstones.mortal(codec.decode(value)):
                batch.put(MORTAL + raw_key[1:], b"")
                indexed += 1
        batch.put(META, json.dumps({**meta, "gc_index": 1}).encode())
        self.db.write(batch, _SYNC)
        log.info("kv_gc_index_built", mortal=indexed)

    async def close(self) -> None:
        await self._loop.close()
        if self.db is not None:
            self.db.close()
            self.db = None

    def _range(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        assert self.db is not None
        options = ReadOptions()
        bound = _after(prefix)
        if bound is not None:
            options.set_iterate_upper_bound(bound)
        it = self.db.iter(options)
        it.seek(start or prefix)
        while it.valid():
            key, value = it.key(), it.value()
            assert isinstance(key, bytes)
            assert isinstance(value, bytes)
            yield key, value
            it.next()

    # -- reads -------------------------------------------------------------------------------

    def get(self, n: int, shard: int, namespace: str, key: str) -> crdt.Value | None:
        raw = self.get_raw(n, shard, namespace, key)
        return None if raw is None else codec.decode(raw)

    def get_raw(self, n: int, shard: int, namespace: str, key: str) -> bytes | None:
        assert self.db is not None
        raw = self.db.get(data_key(n, shard, namespace, key))
        assert raw is None or isinstance(raw, bytes)
        return raw

    def shard_keys(
        self, n: int, shard: int, after: tuple[str, str] | None = None
    ) -> Iterator[tuple[str, str, bytes]]:
        """(namespace, key, envelope) of every key of `shard` for replication factor `n`, in
        (namespace, key) order, after (namespace, key) `after` when given."""
        prefix = DATA + bytes([n]) + shard.to_bytes(2, "big")
        start = None if after is None else data_key(n, shard, *after) + b"\0"
        for raw_key, value in self._range(prefix, start):
            namespace, _, key = raw_key[len(prefix) :].partition(b"\0")
            yield namespace.decode(), key.decode(), value

    def rows(
        self, n: int, namespace: str, key: str, after: str | None, limit: int
    ) -> tuple[list[tuple[str, bytes]], bool]:
        """(row key, envelope) of the rows of `key` (`relay_kv.setrows`) after the row key
        `after`, in order, at most `limit`, and whether more follow."""
        prefix = setrows.row_prefix(key)
        shard = placement.shard_of(namespace, key)
        bound = data_key(n, shard, namespace, prefix)
        start = None if after is None else data_key(n, shard, namespace, after) + b"\0"
        found: list[tuple[str, bytes]] = []
        skip = len(bound) - len(prefix.encode())
        for raw_key, value in self._range(bound, start):
            if len(found) == limit:
                return found, True
            found.append((raw_key[skip:].decode(), value))
        return found, False

    def scan(
        self, n: int, namespace: str, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str, bytes]]:
        """(shard, key, envelope) of `namespace`'s keys for replication factor `n`, in (shard,
        key) order, after the cursor `after`; at most `limit`."""
        prefix = DATA + bytes([n])
        start = None if after is None else data_key(n, after[0], namespace, after[1]) + b"\0"
        found: list[tuple[int, str, bytes]] = []
        wanted = namespace.encode() + b"\0"
        for raw_key, value in self._range(prefix, start):
            if raw_key[4:].startswith(wanted):
                found.append(
                    (
                        int.from_bytes(raw_key[2:4], "big"),
                        raw_key[4 + len(wanted) :].decode(),
                        value,
                    )
                )
                if len(found) >= limit:
                    break
        return found

    def all_keys(self) -> Iterator[tuple[int, int, str, str, bytes]]:
        """(n, shard, namespace, key, envelope) of every key."""
        for raw_key, value in self._range(DATA):
            namespace, _, key = raw_key[4:].partition(b"\0")
            yield (
                raw_key[1],
                int.from_bytes(raw_key[2:4], "big"),
                namespace.decode(),
                key.decode(),
                value,
            )

    def mortal_keys(self) -> Iterator[tuple[int, int, str, str, bytes]]:
        """(n, shard, namespace, key, envelope) of every key whose value is mortal: what
        garbage collection judges, without reading the rest."""
        assert self.db is not None
        for index_key, _ in self._range(MORTAL):
            raw = self.db.get(DATA + index_key[1:])
            if not isinstance(raw, bytes):
                continue
            namespace, _, key = index_key[4:].partition(b"\0")
            yield (
                index_key[1],
                int.from_bytes(index_key[2:4], "big"),
                namespace.decode(),
                key.decode(),
                raw,
            )

    def hints_for(self, target: str, limit: int) -> list[tuple[bytes, bytes, hints.Hint]]:
        found = []
        prefix = target.encode() + hints.SEP
        for key, value in self._range(HINT + prefix):
            found.append((key, value, hints.Hint.decode(key[1:], value)))
            if len(found) >= limit:
                break
        return found

    def hint_targets(self) -> set[str]:
        targets: set[str] = set()
        start = HINT
        while True:
            found = next(self._range(HINT, start), None)
            if found is None:
                return targets
            target = found[0][1:].split(hints.SEP, 1)[0]
            targets.add(target.decode())
            start = HINT + target + bytes([hints.SEP[0] + 1])

    def check(self) -> list[str]:
        """Integrity: every stored shard hash equals a recompute from the data, and the GC
        index names exactly the keys whose values are mortal."""
        recomputed: dict[int, tictac.Tree] = {}
        mortal: set[bytes] = set()
        for n, shard, namespace, key, value in self.all_keys():
            recomputed.setdefault(n, tictac.Tree()).update(
                shard, 0, tictac.key_hash(namespace, key, value)
            )
            if tombstones.mortal(codec.decode(value)):
                mortal.add(data_key(n, shard, namespace, key)[1:])
        indexed = {key[1:] for key, _ in self._range(MORTAL)}
        problems = [f"GC index lacks {k!r}" for k in sorted(mortal - indexed)]
        problems += [f"GC index names {k!r}, not mortal" for k in sorted(indexed - mortal)]
        for n in set(recomputed) | set(self.tree):
            mine = self.tree.get(n, tictac.Tree()).shards
            right = recomputed.get(n, tictac.Tree()).shards
            for shard in set(mine) | set(right):
                if mine.get(shard, 0) != right.get(shard, 0):
                    problems.append(f"n={n} shard {shard}: hash differs from a recompute")
        return problems

    # -- writes ------------------------------------------------------------------------------

    async def _submit(self, job: _Job) -> list[Applied]:
        job.future = asyncio.get_running_loop().create_future()
        if not self._loop.put(job):
            raise RuntimeError("the store is closed")
        return await job.future

    async def merge(self, writes: list[Write]) -> list[Applied]:
        """Merge each write into the store; returns once on disk."""
        return await self._submit(_Job(writes=writes))

    async def add_hints(self, new: list[hints.Hint]) -> bool:
        """Keep hints (merged per target and key); False when over the byte limit."""
        size = sum(len(h.storage_key()) + len(h.encode()) for h in new)
        if not hints.admit(self.hint_bytes, size, self.hint_limits):
            return False
        await self._submit(_Job(hints=new))
        return True

    async def drop_hints(self, read: list[tuple[bytes, bytes]]) -> None:
        await self._submit(_Job(drop_hints=read))

    async def purge(self, judged: list[tuple[Write, bytes]]) -> None:
        await self._submit(_Job(purges=judged))

    async def mark_synced(self, n: int, peer: str, started_ms: int) -> None:
        await self._submit(_Job(synced=[(n, peer, started_ms)]))

    async def _commit(self, jobs: list[_Job]) -> None:
        assert self.db is not None
        batch = WriteBatch(raw_mode=True)
        pending: dict[bytes, bytes | None] = {}
        """What this batch has written so far (later writes of a key merge into it)."""
        results: list[list[Applied]] = []
        hint_delta = 0
        try:
            for job in jobs:
                results.append([self._apply(batch, pending, w) for w in job.writes])
                hint_delta += self._apply_rest(batch, pending, job)
            # On the loop: rocksdict holds the GIL through the write and its fsync, so a thread
            # would stall the loop just the same (measured: one wake-up per write).
            self.db.write(batch, _SYNC)
        except Exception as error:
            log.exception("kv_commit_failed", jobs=len(jobs))
            # Hashes in memory may have moved for a batch that is not on disk: reload them.
            self._reload_tree()
            for job in jobs:
                if job.future is not None and not job.future.done():
                    job.future.set_exception(error)
            return
        self.hint_bytes += hint_delta
        for job in jobs:
            for n, peer, started_ms in job.synced:
                self.synced[(n, peer)] = started_ms
        for job, applied in zip(jobs, results, strict=True):
            if job.future is not None and not job.future.done():
                job.future.set_result(applied)

    def _apply_rest(self, batch: WriteBatch, pending: dict[bytes, bytes | None], job: _Job) -> int:
        """A job's hints, hint deletions, purges and sync marks; returns the hint bytes added."""
        hint_delta = 0
        for hint in job.hints:
            hint_delta += self._apply_hint(batch, pending, hint)
        for key, seen in job.drop_hints:
            if self._current(pending, key) == seen:
                batch.delete(key)
                pending[key] = None
                hint_delta -= len(key) + len(seen)
        for write, seen in job.purges:
            raw_key = data_key(write.n, write.shard, write.namespace, write.key)
            if self._current(pending, raw_key) == seen:
                self._rehash(batch, write, seen, None)
                batch.delete(raw_key)
                batch.delete(MORTAL + raw_key[1:])
                pending[raw_key] = None
        for n, peer, started_ms in job.synced:
            batch.put(SYNCED + bytes([n]) + peer.encode(), _U64.pack(started_ms))
        return hint_delta

    def _reload_tree(self) -> None:
        self.tree = {}
        for key, value in self._range(HASH):
            self.tree.setdefault(key[1], tictac.Tree()).shards[int.from_bytes(key[2:4], "big")] = (
                _U64.unpack(value)[0]
            )

    def _current(self, pending: dict[bytes, bytes | None], key: bytes) -> bytes | None:
        if key in pending:
            return pending[key]
        assert self.db is not None
        raw = self.db.get(key)
        assert raw is None or isinstance(raw, bytes)
        return raw

    def _apply(
        self, batch: WriteBatch, pending: dict[bytes, bytes | None], write: Write
    ) -> Applied:
        raw_key = data_key(write.n, write.shard, write.namespace, write.key)
        old_raw = self._current(pending, raw_key)
        old = None if old_raw is None else codec.decode(old_raw)
        newer = crdt.newer_than(old, write.value)
        merged = write.value if old is None else crdt.merge(old, write.value)
        new_raw = codec.encode(merged)
        if new_raw != old_raw:
            self._rehash(batch, write, old_raw, new_raw)
            batch.put(raw_key, new_raw)
            pending[raw_key] = new_raw
            was_mortal = old is not None and tombstones.mortal(old)
            if tombstones.mortal(merged) != was_mortal:
                if was_mortal:
                    batch.delete(MORTAL + raw_key[1:])
                else:
                    batch.put(MORTAL + raw_key[1:], b"")
        return Applied(merged, newer)

    def _rehash(
        self, batch: WriteBatch, write: Write, old: bytes | None, new: bytes | None
    ) -> None:
        tree = self.tree.setdefault(write.n, tictac.Tree())
        value = tree.update(
            write.shard,
            tictac.key_hash(write.namespace, write.key, old),
            tictac.key_hash(write.namespace, write.key, new),
        )
        if value:
            batch.put(_hash_key(write.n, write.shard), _U64.pack(value))
        else:
            batch.delete(_hash_key(write.n, write.shard))

    def _apply_hint(
        self, batch: WriteBatch, pending: dict[bytes, bytes | None], hint: hints.Hint
    ) -> int:
        key = HINT + hint.storage_key()
        old_raw = self._current(pending, key)
        old = None if old_raw is None else hints.Hint.decode(key[1:], old_raw)
        new_raw = hints.merge_hint(old, hint).encode()
        batch.put(key, new_raw)
        pending[key] = new_raw
        return (
            len(new_raw)
            - (0 if old_raw is None else len(old_raw))
            + (len(key) if old_raw is None else 0)
        )
