"""The floor of the key-value path (issue 21): the whole mandated path of a `/v1/kv` request,
built from the components Relay runs on and nothing of Relay's own logic, against etcd in the
same run.

    .venv/bin/python bench/kv_floor_bench.py
        options (defaults): --clients 64 --seconds 10 --warmup 90 --keys 2000

A client's `PUT` or `GET /v1/kv/bench/{key}` goes to a front process (uvicorn with httptools
on uvloop, as the ingress; a bare ASGI function, no routing, no validation, no auth) that
produces a request to Kafka (Relay's broker from `relayctl up`, Relay's producer settings, 8
partitions keyed by the key's hash, as `relay.replication`) and awaits its reply on a reply
partition. Three replica processes each read requests as members of one consumer group and
commit after each batch (the coordinator's role), and serve the other two over HTTP (uvicorn,
httptools; `aiohttp` as the caller, one call in flight per peer with the items asked meanwhile
batched into the next, as `relay_replicator.peer_calls`). A write goes to the coordinating
process's RocksDB (rocksdict, one synced `WriteBatch` per group of writes, as the store) and to
both peers; the reply is produced after W=2 acknowledgements. A read asks all three and answers
after R=2. No versions, merges, hashes, schemas, tokens, metrics or logs: what is left is what
the path costs at the least on these cores.

Relay itself (`relayctl up --replicators 3`, N=3, W=2, R=2) and etcd (three members,
`bench/setup-peers.sh`) run the same workload after it, in the same run, each alone and warmed
as `bench/kv_bench.py` warms them (its client, its systems). The last line is the JSON summary:
per system and mix (write-only, read-only), operations per second, p50 / p99 ms and CPU ms per
operation of every process; and the ratios floor / etcd (what the mandated path can reach here
at best), Relay / etcd and Relay / floor (what Relay's own logic costs on top).

`--commit-s S` lets the floor's coordinators commit their offsets at most every S seconds
instead of after every batch, to show what that rule costs (Relay keeps it: decision 0011).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import secrets
import tempfile
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import report
import uvicorn
import uvloop
from kafka_hop_bench import PARTITIONS, Asker, coordinating, make_topics
from kv_bench import MIXES, ROOT, Etcd, Relay, free_port, preload, run, warm
from rawhttp import RawHttp
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from relay_durable.batching import BatchLoop

W = R = 2


async def listen(app: Any, port: int) -> asyncio.Task[None]:
    """Serve `app` on `port` (as Relay's services: uvicorn, httptools, this uvloop); returns
    once it accepts connections."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http="httptools",
        lifespan="off",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
        await asyncio.sleep(0.05)
    return serving


async def body_of(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def answer(send: Any, body: bytes) -> None:
    """A 200 with a JSON body."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- the front (the ingress's part) --------------------------------------------------------------


async def front(bootstrap: str, requests: str, replies: str, port: int, ready: Any) -> None:
    asker = Asker(bootstrap, replies)
    await asker.start()

    async def app(scope: Any, receive: Any, reply: Any) -> None:
        key = scope["path"].rpartition("/")[2]
        body = await body_of(receive)
        op = b"w" if scope["method"] == "PUT" else b"r"
        partition = zlib.crc32(key.encode()) % PARTITIONS
        await answer(reply, await asker.ask(requests, partition, op + key.encode() + b"\0" + body))

    serving = await listen(app, port)
    ready.set()
    await serving


# -- a replica and coordinator (the replicator's part) -------------------------------------------


class Store:
    """RocksDB with group commit: the writes asked while one synced batch is written go in the
    next."""

    def __init__(self, path: str) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self.db = Rdict(path, options)
        self.sync = WriteOptions()
        self.sync.sync = True
        self.loop: BatchLoop[tuple[list[tuple[bytes, bytes]], asyncio.Future[None]]] = BatchLoop(
            self._commit, "store"
        )
        self.loop.start()

    async def write(self, items: list[tuple[bytes, bytes]]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.loop.put((items, future))
        await future

    async def _commit(
        self, jobs: list[tuple[list[tuple[bytes, bytes]], asyncio.Future[None]]]
    ) -> None:
        batch = WriteBatch(raw_mode=True)
        for items, _ in jobs:
            for key, value in items:
                batch.put(key, value)
        self.db.write(batch, self.sync)
        for _, future in jobs:
            future.set_result(None)

    def read(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.db.get(key) for key in keys]


class PeerCalls:
    """One call in flight per (peer, path); the items asked meanwhile leave in the next call."""

    def __init__(self, session: aiohttp.ClientSession, url: str, path: str) -> None:
        self.session = session
        self.url = url + path
        self.loop: BatchLoop[tuple[list[Any], asyncio.Future[list[Any]]]] = BatchLoop(
            self._call, path
        )
        self.loop.start()

    async def ask(self, items: list[Any]) -> list[Any]:
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.loop.put((items, future))
        return await future

    async def _call(self, groups: list[tuple[list[Any], asyncio.Future[list[Any]]]]) -> None:
        body = orjson.dumps([item for items, _ in groups for item in items])
        async with self.session.post(self.url, data=body) as response:
            answers = orjson.loads(await response.read())
        start = 0
        for items, future in groups:
            future.set_result(answers[start : start + len(items)])
            start += len(items)


async def replica(
    bootstrap: str,
    requests: str,
    replies: str,
    ports: list[int],
    me: int,
    data: str,
    commit_s: float,
    ready: Any,
) -> None:
    store = Store(data)

    async def app(scope: Any, receive: Any, reply: Any) -> None:
        items = orjson.loads(await body_of(receive))
        if scope["path"] == "/w":
            await store.write([(k.encode(), v.encode()) for k, v in items])
            await answer(reply, orjson.dumps([True] * len(items)))
        else:
            found = store.read([k.encode() for k in items])
            await answer(reply, orjson.dumps([None if v is None else v.decode() for v in found]))

    serving = await listen(app, ports[me])
    session = aiohttp.ClientSession()
    peers = [f"http://127.0.0.1:{port}" for i, port in enumerate(ports) if i != me]
    writes = [PeerCalls(session, url, "/w") for url in peers]
    reads = [PeerCalls(session, url, "/r") for url in peers]
    send, read = await coordinating(bootstrap, requests)

    async def quorum(asks: list[Any], needed: int) -> list[Any]:
        done: list[Any] = []
        for finished in asyncio.as_completed(asks):
            done.append(await finished)
            if len(done) >= needed:
                return done
        return done

    async def coordinate(value: bytes) -> None:
        request, op, rest = value[:16], value[16:17], value[17:]
        key, _, body = rest.partition(b"\0")
        if op == b"w":
            stored = body.decode()
            asks = [store.write([(key, body)])] + [p.ask([[key.decode(), stored]]) for p in writes]
            await quorum(asks, W)
            result = b'{"ok":true}'
        else:

            async def local() -> list[Any]:
                return [None if (v := store.read([key])[0]) is None else v.decode()]

            asks = [local()] + [p.ask([key.decode()]) for p in reads]
            found = await quorum(asks, R)
            result = orjson.dumps({"value": next((v[0] for v in found if v[0]), None)})
        await send.send(replies, request + result, partition=0)

    tasks: set[asyncio.Task[None]] = {serving}
    loop = asyncio.get_running_loop()
    next_commit = 0.0
    ready.set()
    while True:
        batches = await read.getmany(timeout_ms=200, max_records=500)
        for records in batches.values():
            for record in records:
                task = asyncio.create_task(coordinate(record.value))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if batches and loop.time() >= next_commit:
            await read.commit()
            next_commit = loop.time() + commit_s


def run_front(*args: Any) -> None:
    uvloop.run(front(*args))


def run_replica(*args: Any) -> None:
    uvloop.run(replica(*args))


class Floor:
    """The path's skeleton as a `kv_bench` system."""

    name = "floor"

    def __init__(self, work: Path, commit_s: float) -> None:
        self.relay = Relay(work)
        bootstrap = self.relay.bootstrap()
        run_id = secrets.token_hex(3)
        requests, replies = f"floor-asks-{run_id}", f"floor-answers-{run_id}"
        asyncio.run(make_topics(bootstrap, requests, replies))
        forked = multiprocessing.get_context("fork")
        self.port = free_port()
        ports = [free_port() for _ in range(3)]
        self.children: dict[str, Any] = {}
        for i in range(3):
            ready = forked.Event()
            data = str(work / f"floor-{i}")
            self.children[f"replica-{i}"] = child = forked.Process(
                target=run_replica,
                args=(bootstrap, requests, replies, ports, i, data, commit_s, ready),
                daemon=True,
            )
            child.start()
            ready.wait(60)
        ready = forked.Event()
        self.children["front"] = child = forked.Process(
            target=run_front, args=(bootstrap, requests, replies, self.port, ready), daemon=True
        )
        child.start()
        ready.wait(60)
        self.clients: list[RawHttp] = []

    def server_pids(self) -> dict[str, int]:
        return {
            "broker": self.relay.server_pids()["broker"],
            **{name: child.pid for name, child in self.children.items()},
        }

    async def open(self, workers: int) -> None:
        self.clients = [RawHttp("127.0.0.1", self.port) for _ in range(workers)]

    async def write(self, worker: int, key: str, value: bytes) -> bool:
        body = value.hex().encode()
        status, _ = await self.clients[worker].request("PUT", f"/v1/kv/bench/{key}", body)
        return status == 200

    async def read(self, worker: int, key: str) -> bool:
        status, _ = await self.clients[worker].request("GET", f"/v1/kv/bench/{key}")
        return status == 200

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    def stop(self) -> None:
        for child in self.children.values():
            child.kill()
        self.relay.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=90)
    parser.add_argument("--warmup-max", type=float, default=240)
    parser.add_argument(
        "--commit-s",
        type=float,
        default=0,
        help="most seconds between the coordinators' offset commits (0: after every batch, as "
        "Relay's coordinator)",
    )
    options = parser.parse_args()
    keys = [f"key-{i}" for i in range(options.keys)]
    value = os.urandom(options.value_bytes)
    summary: dict[str, Any] = {
        "clients": options.clients,
        "seconds": options.seconds,
        "commit_s": options.commit_s,
    }
    (ROOT / "var").mkdir(exist_ok=True)
    for make in (Floor, Relay, Etcd):
        with tempfile.TemporaryDirectory(dir=ROOT / "var", prefix="kv-floor-") as work:
            system: Any = Floor(Path(work), options.commit_s) if make is Floor else make(Path(work))
            try:
                asyncio.run(preload(system, keys, value))
                warmed = warm(system, keys, options.clients, value, options)
                summary[f"{make.name}_warmup_s"] = warmed
                for mix_name in ("write", "read"):
                    found = asyncio.run(
                        run(system, keys, options.clients, MIXES[mix_name], options.seconds, value)
                    )
                    for figure, number in found.items():
                        summary[f"{make.name}_{mix_name}_{figure}"] = number
            finally:
                system.stop()
    for mix_name in ("write", "read"):
        for system_name, base in (("floor", "etcd"), ("relay", "etcd"), ("relay", "floor")):
            summary[f"ratio_{system_name}_vs_{base}_{mix_name}"] = round(
                summary[f"{system_name}_{mix_name}_ops_per_s"]
                / summary[f"{base}_{mix_name}_ops_per_s"],
                3,
            )
    report.emit(summary)


if __name__ == "__main__":
    main()
