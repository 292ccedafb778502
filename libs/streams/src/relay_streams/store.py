"""The durable stream store: a folder of databases and this site's identity (seed 003).

Layout on disk (`root`):
- `site.json` (this site's id, made at first start), `sites.json` (known sites);
- `dbs/<name>/db.json` and `dbs/<name>/shard-<i>/` (a RocksDB instance per shard).

The facade takes database names, as EMQX's `emqx_ds` module does (`store_batch(db, ...)`,
`get_streams(db, ...)`, ...), and hands each call to the open `Database`; it also answers what
`/ds` and `relayctl ds` show (`description`, `storages`, replica and site changes).

Invariants:
- a database is open at most once per store (RocksDB's lock also refuses a second process);
- dropping a database first renames its folder to `<name>.dropping`, then removes it; a
  leftover `.dropping` folder (crash in between) is removed at the next start;
- this site's id never changes for the life of `root`.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from relay_ds.info import Description, DsInfo, Storage, StorageShare
from relay_ds.sites import SiteId
from relay_ds.tokens import Stream, StreamIterator
from relay_ds.view import View
from relay_streams import catalog, sites
from relay_streams.database import Database, GenerationInfo
from relay_streams.errors import BadInput, Closed, NotFound
from relay_streams.marks import Mark
from relay_streams.model import Message, NextResult, RankedStream
from relay_streams.settings import DbSettings

log = structlog.get_logger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class StreamStore:
    def __init__(
        self,
        root: Path,
        *,
        node: str | None = None,
        clock: Callable[[], int] = now_ms,
        read_only: bool = False,
    ) -> None:
        """`node`: the name shown next to this site (default: the host name). `read_only`: an
        existing store as it stands now, for reading only, while its owner may go on writing
        (`relay_streams.reading`): nothing under `root` is changed; its databases open
        read-only."""
        self.root = root
        self.clock = clock
        self.read_only = read_only
        self.dbs_dir = root / "dbs"
        if read_only:
            if not (root / "site.json").exists():
                raise NotFound(f"{root}: not a stream store (no site.json)")
            self.site = sites.load_or_create_site(root)
            self.registry = sites.SiteRegistry(root, self.site, node, save=False)
        else:
            root.mkdir(parents=True, exist_ok=True)
            self.dbs_dir.mkdir(exist_ok=True)
            for leftover in self.dbs_dir.glob("*.dropping"):
                log.warning("streams_drop_finished_on_start", folder=str(leftover))
                shutil.rmtree(leftover)
            self.site = sites.load_or_create_site(root)
            self.registry = sites.SiteRegistry(root, self.site, node or socket.gethostname())
        self._dbs: dict[str, Database] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- databases -------------------------------------------------------------------------

    def open_db(self, name: str, settings: DbSettings | None = None) -> Database:
        """Open (creating if needed) a database. For an existing one, `settings` (if given)
        replace the recorded ones except `shards`, which must match; an open database with
        other settings is refused."""
        name = catalog.parse_name(name)
        with self._lock:
            if self._closed:
                raise Closed("the stream store is closed")
            db = self._dbs.get(name)
            if db is not None:
                if settings is not None and settings != db.settings:
                    raise BadInput(f"database {name!r} is open with other settings; close it")
                return db
            if self.read_only and settings is not None:
                raise BadInput("a read-only store opens databases as they are")
            db = Database(
                self.dbs_dir / name, name, settings, self.site, self.clock, self.read_only
            )
            self._dbs[name] = db
            return db

    def db(self, name: str) -> Database:
        db = self._dbs.get(name)
        if db is None:
            raise NotFound(f"database {name!r} is not open")
        return db

    def list_dbs(self) -> list[str]:
        """Every database on disk, open or not."""
        if not self.dbs_dir.is_dir():
            return []
        return sorted(p.name for p in self.dbs_dir.iterdir() if (p / "db.json").exists())

    def close_db(self, name: str) -> None:
        with self._lock:
            db = self._dbs.pop(name, None)
        if db is not None:
            db.close()

    def drop_db(self, name: str) -> None:
        """Close a database and remove all its data."""
        name = catalog.parse_name(name)
        self.close_db(name)
        folder = self.dbs_dir / name
        if not folder.exists():
            raise NotFound(f"database {name!r} does not exist")
        doomed = folder.with_name(name + ".dropping")
        folder.rename(doomed)
        shutil.rmtree(doomed)

    def checkpoint(self, target: Path) -> None:
        """A point-in-time copy of every open database at `target` (a new folder on the same
        filesystem), openable as a `StreamStore`: this site's files, each database's record
        and a RocksDB checkpoint of each shard (hard links). Each shard's copy holds a write
        batch wholly or not at all; shards are copied one after another."""
        target.mkdir(parents=True)
        for name in ("site.json", "sites.json"):
            if (self.root / name).exists():
                shutil.copyfile(self.root / name, target / name)
        with self._lock:
            dbs = dict(self._dbs)
        for name, db in sorted(dbs.items()):
            db.checkpoint(target / "dbs" / name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            dbs, self._dbs = list(self._dbs.values()), {}
        for db in dbs:
            db.close()

    # -- the emqx_ds-style calls -----------------------------------------------------------

    def store_batch(
        self,
        db: str,
        messages: Iterable[Message | tuple[str, bytes]],
        sync: bool = True,
        positions: Sequence[Mark | None] | None = None,
    ) -> list[Message]:
        """`Database.store_batch` (`positions`: where each message came from in the log)."""
        return self.db(db).store_batch(messages, sync, positions)

    def get_streams(self, db: str, topic_filter: str, start: int = 0) -> list[RankedStream]:
        return self.db(db).get_streams(topic_filter, start)

    def make_iterator(
        self, db: str, stream: Stream | str, topic_filter: str, start: int = 0
    ) -> StreamIterator:
        return self.db(db).make_iterator(stream, topic_filter, start)

    def next(
        self, db: str, iterator: StreamIterator | str, n: int, max_bytes: int | None = None
    ) -> NextResult:
        return self.db(db).next(iterator, n, max_bytes)

    def every_message(self, db: str, page: int = 10_000) -> Iterator[list[Message]]:
        """Every message of the database, `$` topics included (`Database.every_message`)."""
        return self.db(db).every_message(page)

    def delete(
        self,
        db: str,
        topic_filter: str,
        predicate: Callable[[Message], bool] | None = None,
        start: int = 0,
    ) -> int:
        return self.db(db).delete(topic_filter, predicate, start)

    def add_generation(self, db: str, since: int | None = None) -> GenerationInfo:
        return self.db(db).add_generation(since)

    def list_generations(self, db: str) -> list[GenerationInfo]:
        return self.db(db).generations()

    def drop_generation(self, db: str, number: int) -> None:
        self.db(db).drop_generation(number)

    def check(self) -> list[str]:
        """`Database.check` of every open database."""
        with self._lock:
            dbs = list(self._dbs.values())
        return [problem for db in dbs for problem in db.check()]

    # -- sites and replicas (what /ds and `relayctl ds` show) -------------------------------

    def this_site(self) -> SiteId:
        return self.site

    def _record(self, name: str) -> catalog.DbRecord:
        name = catalog.parse_name(name)
        db = self._dbs.get(name)
        if db is not None:
            return db.record
        path = self.dbs_dir / name / "db.json"
        if not path.exists():
            raise NotFound(f"unknown storage {name!r}")
        return catalog.DbRecord.load(path)

    def storages(self) -> list[str]:
        return self.list_dbs()

    def storage(self, name: str) -> Storage:
        db = self._dbs.get(name)
        if db is not None:
            return Storage(name, db.shard_infos())
        record = self._record(name)
        shards = sites.shard_infos(record.replicas, record.settings.shards, self.site)
        return Storage(name, shards)

    def description(
        self,
        node: str,
        partitions: Sequence[int],
        shard_id: Callable[[int], int] = lambda shard: shard,
    ) -> Description:
        """What this site tells `/ds` of itself (`relay_ds.info.Description`): `node` and the
        `partitions` its retainer owns (lowest first), the sites it knows, and each storage's
        replica-set target and shards, numbered by `shard_id` (the retainer's are global)."""
        storages = [
            StorageShare(
                name,
                self.replicas(name),
                [replace(s, id=str(shard_id(int(s.id)))) for s in self.storage(name).shards],
            )
            for name in self.storages()
        ]
        known = sorted(self.registry.sites.values(), key=lambda k: k.site)
        return Description(self.site, node, list(partitions), known, storages)

    def view(self) -> View:
        """`/ds` of this store alone, as if its retainer were the only one."""
        return View([self.description(self.registry.sites[self.site].node, [0])])

    def info(self) -> DsInfo:
        """What `ds info` prints of this store alone (`relay_ds.info.render_info`)."""
        return self.view().info()

    def register_site(self, site: str, node: str) -> SiteId:
        """Record another site (the operator does this when a site joins)."""
        return self.registry.register(site, node)

    def forget_site(self, site: str) -> None:
        """Forget a site that holds and is to hold no replica (EMQX: `ds forget`)."""
        wanted = self.registry.known(site)
        if wanted == self.site:
            raise BadInput("this site cannot be forgotten")
        for name in self.storages():
            replicas = self._record(name).replicas
            if wanted in replicas.target or wanted in replicas.current:
                raise BadInput(f"site {wanted} is in the replica set of {name!r}")
        self.registry.forget(wanted)

    def replicas(self, name: str) -> list[SiteId]:
        """The replica set target of a database."""
        return list(self._record(name).replicas.target)

    def set_replicas(self, name: str, target: Sequence[str]) -> None:
        """Record a new replica set target (validated: known sites, not empty). Until the
        replicator exists no data moves: differences show as transitions."""
        parsed = sites.validate_target(list(target), self.registry)
        db = self._dbs.get(name)
        if db is not None:
            db.set_replicas(parsed)
            return
        record = self._record(name)
        record.replicas.target = parsed
        record.save(self.dbs_dir / name / "db.json")

    def join(self, name: str, site: str) -> None:
        current = self.replicas(name)
        wanted = sites.parse_site(site)
        if wanted not in current:
            self.set_replicas(name, [*current, wanted])

    def leave(self, name: str, site: str) -> None:
        wanted = sites.parse_site(site)
        self.set_replicas(name, [s for s in self.replicas(name) if s != wanted])
