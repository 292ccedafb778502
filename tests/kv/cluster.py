"""Several real replicator processes (and an ingress) on loopback, every replicator-to-replicator
link through a TCP proxy of its own that a test can cut and heal.

A link X->Y is the URL X has for Y: X's `RELAY_KV__PEERS` names Y through the proxy of that
link, so cutting (X, Y) both ways is a partition of exactly that pair while every other path
(Kafka, the other replicators, a test reading Y directly) still works. A cut link drops its open
connections and holds new ones unanswered (a black hole: the caller times out, as behind a
dropped route), until healed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relayctl import processes
from tests import helpers

TOKEN = "kv-test-admin-token"


class Link:
    """One direction of one pair: a TCP proxy to `target_port`. Cut, it drops every byte (as a
    partition drops packets): open connections hang, new ones are accepted and never answered,
    so callers wait for their own timeouts. A connection that lived through a cut stays dead
    and is closed when the link heals (its bytes were lost)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target_port: int) -> None:
        self.loop = loop
        self.target_port = target_port
        self.port = helpers.free_port()
        self.cut = False
        self._cuts = 0
        self._open: dict[asyncio.StreamWriter, int] = {}
        """Every open socket's writer -> the number of cuts before it opened."""
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    def _alive(self, born: int) -> bool:
        return not self.cut and born == self._cuts

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        born = self._cuts
        self._open[writer] = born
        try:
            if self.cut:  # accepted, never answered
                await reader.read()
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._open[up_writer] = born
            await asyncio.gather(
                self._pipe(reader, up_writer, born),
                self._pipe(up_reader, writer, born),
                return_exceptions=True,
            )
        except OSError:
            pass
        finally:
            writer.close()
            self._open.pop(writer, None)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, born: int
    ) -> None:
        try:
            while data := await reader.read(65536):
                if self._alive(born):  # otherwise dropped
                    writer.write(data)
                    await writer.drain()
        finally:
            writer.close()
            self._open.pop(writer, None)

    async def _heal(self) -> None:
        self.cut = False
        for writer, born in list(self._open.items()):
            if born != self._cuts:
                writer.close()

    def set_cut(self, cut: bool) -> None:
        if cut and not self.cut:
            self.cut = True
            self._cuts += 1
        elif not cut and self.cut:
            asyncio.run_coroutine_threadsafe(self._heal(), self.loop).result(5)


@dataclass
class Replicator:
    name: str
    port: int
    data_dir: Path
    process: processes.Forked | None = None
    site: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}{path}", headers=_admin(), timeout=5)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = httpx.post(f"{self.url}{path}", json=body, headers=_admin(), timeout=5)
        response.raise_for_status()
        return response.json()

    def local_value(self, n: int, ns: str, key: str) -> Any:
        """What this replica stores for the key (tombstones included), read directly."""
        return self.post("/internal/kv/read", {"items": [{"n": n, "ns": ns, "key": key}]})[
            "values"
        ][0]


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Cluster:
    root: Path
    kafka: helpers.Kafka
    redis_url: str
    names: tuple[str, ...] = ("A", "B", "C", "D")
    env: dict[str, str] = field(default_factory=dict)
    direct: bool = False
    """Replicators name each other by their own ports (no link proxies, nothing to cut): a
    killed one's address refuses connections, as a stopped process's does."""
    replicator_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra environment of one replicator (by name), kept across its restarts."""
    replicators: dict[str, Replicator] = field(default_factory=dict)
    links: dict[tuple[str, str], Link] = field(default_factory=dict)
    ingress: processes.Forked | None = None
    ingress_port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @property
    def ingress_url(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        for name in self.names:
            self.replicators[name] = Replicator(name, helpers.free_port(), self.root / name)
        for a in self.names:
            for b in self.names:
                if a != b:
                    link = Link(self._loop, self.replicators[b].port)
                    asyncio.run_coroutine_threadsafe(link.start(), self._loop).result(5)
                    self.links[(a, b)] = link
        for name in self.names:
            self._start_replicator(name)
        self.ingress_port = helpers.free_port()
        self.ingress = self.spawn(
            "relay-ingress",
            {
                "RELAY_HTTP__PORT": str(self.ingress_port),
                "RELAY_INSTANCE": "ingress-kv",
                "RELAY_REDIS_URL": self.redis_url,
            },
            self.root / "ingress.log",
        )
        for replicator in self.replicators.values():
            self.wait_ready(replicator.url, replicator.process)
            replicator.site = replicator.get("/internal/kv/site")["site"]
        self.wait_ready(self.ingress_url, self.ingress)
        self.wait_for_partitions()

    def spawn(self, script: str, extra: dict[str, str], log: Path) -> processes.Forked:
        log.parent.mkdir(parents=True, exist_ok=True)
        env = helpers.service_env(RELAY_ADMIN_TOKEN=TOKEN, **self.kafka.env(), **self.env, **extra)
        return helpers.start_service(script, env, log)

    def _start_replicator(self, name: str) -> None:
        me = self.replicators[name]
        peers = [me.url] + [
            self.replicators[other].url
            if self.direct
            else f"http://127.0.0.1:{self.links[(name, other)].port}"
            for other in self.names
            if other != name
        ]
        me.process = self.spawn(
            "relay-replicator",
            {
                "RELAY_HTTP__PORT": str(me.port),
                "RELAY_INSTANCE": f"replicator-{name}",
                "RELAY_DATA__DIR": str(me.data_dir),
                "RELAY_KV__PEERS": json.dumps(peers),
                **self.replicator_env.get(name, {}),
            },
            self.root / f"replicator-{name}.log",
        )

    def add(self, name: str) -> Replicator:
        """Start one more replicator (a site that is to join): a link to and from each other,
        its list naming every replicator; the others' lists name it only once they restart
        (until then they reach it by the URL it announces)."""
        assert self._loop is not None
        others = self.names
        self.names = (*others, name)
        self.replicators[name] = Replicator(name, helpers.free_port(), self.root / name)
        for other in others:
            for a, b in ((name, other), (other, name)):
                link = Link(self._loop, self.replicators[b].port)
                asyncio.run_coroutine_threadsafe(link.start(), self._loop).result(5)
                self.links[(a, b)] = link
        self._start_replicator(name)
        added = self.replicators[name]
        self.wait_ready(added.url, added.process)
        added.site = added.get("/internal/kv/site")["site"]
        return added

    def wait_ready(self, url: str, process: processes.Forked | None, budget: float = 60) -> None:
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{url} exited; see the logs under {self.root}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{url} not ready within {budget} s; logs under {self.root}")

    def wait_for_partitions(self, budget: float = 60) -> dict[str, list[int]]:
        """Until every partition of `relay.replication` is held by exactly one replicator."""
        partitions = int(os.environ.get("RELAY_KAFKA__PARTITIONS", "8"))
        deadline = time.monotonic() + budget
        while True:
            held = {
                n: r.get("/internal/kv/status")["partitions"] for n, r in self.replicators.items()
            }
            everything = sorted(p for ps in held.values() for p in ps)
            if everything == list(range(partitions)):
                return held
            if time.monotonic() > deadline:
                raise TimeoutError(f"partitions never settled: {held}")
            time.sleep(0.2)

    def kill(self, name: str) -> None:
        """SIGKILL a replicator (its data dir stays)."""
        process = self.replicators[name].process
        assert process is not None
        process.kill()
        process.wait()

    def restart(self, name: str) -> None:
        """Start a killed replicator again on its port and data dir; wait until it is ready."""
        self._start_replicator(name)
        replicator = self.replicators[name]
        self.wait_ready(replicator.url, replicator.process)

    def signal(self, name: str, signum: int) -> None:
        process = self.replicators[name].process
        assert process is not None
        process.send_signal(signum)

    def cut(self, a: str, b: str, cut: bool = True) -> None:
        self.links[(a, b)].set_cut(cut)
        self.links[(b, a)].set_cut(cut)

    def isolate(self, name: str, cut: bool = True) -> None:
        for other in self.names:
            if other != name:
                self.cut(name, other, cut)

    def stop(self) -> None:
        processes = [r.process for r in self.replicators.values()] + [self.ingress]
        for process in processes:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in processes:
            if process is not None:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)


@contextlib.contextmanager
def cluster(
    root: Path,
    kafka: helpers.Kafka,
    redis_url: str,
    names: tuple[str, ...] = ("A", "B", "C", "D"),
    **env: str,
) -> Iterator[Cluster]:
    running = Cluster(root, kafka, redis_url, names=names, env=env)
    try:
        running.start()
        yield running
    finally:
        running.stop()


class Client:
    """The `/v1/kv` API through the ingress, as a client uses it."""

    def __init__(self, url: str, token: str = "", timeout_s: float = 30) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=timeout_s)
        self.token = token

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def namespace(self, ns: str, **body: Any) -> httpx.Response:
        return self.http.put(f"/admin/kv/namespaces/{ns}", json=body, headers=_admin())

    def put(self, ns: str, key: str, value: bytes, **query: Any) -> httpx.Response:
        from relay_durable.codec import b64u

        return self.http.put(
            f"/v1/kv/{ns}/{key}", json={"value": b64u(value)}, params=query, headers=self._auth()
        )

    def get(self, ns: str, key: str, **query: Any) -> httpx.Response:
        return self.http.get(f"/v1/kv/{ns}/{key}", params=query, headers=self._auth())

    def delete(self, ns: str, key: str, **query: Any) -> httpx.Response:
        return self.http.delete(f"/v1/kv/{ns}/{key}", params=query, headers=self._auth())

    def members(
        self, ns: str, key: str, add: list[bytes] = (), remove: list[bytes] = ()
    ) -> httpx.Response:  # type: ignore[assignment]
        from relay_durable.codec import b64u

        return self.http.post(
            f"/v1/kv/{ns}/{key}/members",
            json={"add": [b64u(m) for m in add], "remove": [b64u(m) for m in remove]},
            headers=self._auth(),
        )

    def list_members(self, ns: str, key: str, **query: Any) -> httpx.Response:
        return self.http.get(f"/v1/kv/{ns}/{key}/members", params=query, headers=self._auth())

    def field(
        self, method: str, ns: str, key: str, name: str, value: bytes | None = None
    ) -> httpx.Response:
        from relay_durable.codec import b64u

        body = None if value is None else {"value": b64u(value)}
        return self.http.request(
            method, f"/v1/kv/{ns}/{key}/fields/{name}", json=body, headers=self._auth()
        )

    def list_fields(self, ns: str, key: str, **query: Any) -> httpx.Response:
        return self.http.get(f"/v1/kv/{ns}/{key}/fields", params=query, headers=self._auth())
