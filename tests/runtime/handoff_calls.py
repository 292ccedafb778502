"""The operator's part of a partition hand-off, played by a test against real service
processes (queue-writers or retainers: the routes of `relay_bus.handoff_routes`): the pool
(`one_then_two`), the calls, and `move` (prefetch, pause, catch-up, then commit and release,
or a rollback)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests import helpers

TOKEN = "handoff-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PARTITIONS = 4
CALL_TIMEOUT_S = 30.0
"""Of each hand-off call (`bench/handoff_bench.py` raises it for its large partitions)."""


@contextmanager
def one_then_two(script: str, kafka: helpers.Kafka, root: Path) -> Iterator[tuple[str, str]]:
    """A pool of one instance of `script` (generation 1: every partition on ordinal 0) and a
    second one, started after it, owning nothing: the state before a scale from 1 to 2. Their
    data dirs are `root/d<k>`, their logs `root/<service>-<k>.log`."""
    service = script.removeprefix("relay-")
    with ExitStack() as stack:
        a, b = (
            stack.enter_context(
                helpers.running_service(
                    script,
                    60,
                    log=root / f"{service}-{k}.log",
                    **kafka.env(),
                    RELAY_KAFKA__PARTITIONS=str(PARTITIONS),
                    RELAY_ADMIN_TOKEN=TOKEN,
                    RELAY_DATA__DIR=str(root / f"d{k}"),
                    RELAY_DATA__ORDINAL=str(k),
                    RELAY_DATA__REPLICAS="1",
                    RELAY_INSTANCE=f"{service}-{k}",
                )
            )
            for k in (0, 1)
        )
        yield a, b


def call(method: str, url: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, url, json=body, headers=AUTH, timeout=CALL_TIMEOUT_S)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def install(url: str, generation: int, owners: list[int]) -> dict[str, Any]:
    assignment = {"generation": generation, "partitions": PARTITIONS, "replicas": 2}
    return ok(call("PUT", f"{url}/internal/ownership", {**assignment, "assignment": owners}))


def serving(*urls: str) -> list[list[int]]:
    return [ok(call("GET", f"{url}/internal/ownership"))["serving"] for url in urls]


def one_owner(*urls: str) -> None:
    flat = [p for share in serving(*urls) for p in share]
    assert len(flat) == len(set(flat)), f"two owners: {serving(*urls)}"


def export(url: str, partition: int) -> dict[str, Any]:
    return ok(call("GET", f"{url}/internal/partitions/{partition}/export"))


def import_(url: str, state: dict[str, Any]) -> dict[str, Any]:
    return ok(call("PUT", f"{url}/internal/partitions/{state['partition']}/import", state))


def pull(target: str, step: str, source: str, partition: int) -> dict[str, Any]:
    """`prefetch` or `catch-up` on the target from the source."""
    url = f"{target}/internal/partitions/{partition}/{step}"
    return ok(call("POST", url, {"source": source}))


def digest(url: str, partition: int) -> str:
    digest: str = ok(call("GET", f"{url}/internal/partitions/{partition}/state"))["digest"]
    return digest


@dataclass
class Moved:
    committed: bool
    pause_s: float
    source_digest: str
    target_digest: str
    prefetch_s: float
    steps_s: dict[str, float] = field(default_factory=dict)
    """Within the pause: the source's pause (its install), the catch-up, the commit."""
    carried: dict[str, Any] = field(default_factory=dict)
    """What the catch-up carried: `queues`, `deleted`, and `whole` (False: the changes only)."""


def move(
    source: str,
    target: str,
    partition: int,
    before: list[int],
    generation: int,
    budget_s: float = 2.0,
    after_prefetch: Callable[[], None] = lambda: None,
) -> Moved:
    """Move `partition` from `source` to `target` (the operator's part, see the docstring)."""
    after = list(before)
    after[partition] = 1 - before[partition]
    started = time.monotonic()
    pull(target, "prefetch", source, partition)  # the source keeps serving
    prefetch_s = time.monotonic() - started
    one_owner(source, target)
    after_prefetch()

    assignment = {"generation": generation, "partitions": PARTITIONS, "replicas": 2}
    paused = time.monotonic()
    # pause: once it answers, the source applies no command of the partition
    at_pause = ok(
        call(
            "POST",
            f"{source}/internal/partitions/{partition}/pause",
            {**assignment, "assignment": after},
        )
    )
    fenced = time.monotonic()
    assert not at_pause["serving"], at_pause
    source_digest = at_pause["digest"]
    caught_up = pull(target, "catch-up", source, partition)
    target_digest, carried = caught_up["digest"], caught_up["carried"]
    copied = time.monotonic()
    steps = {"pause": fenced - paused, "catch_up": copied - fenced}
    pause_s = copied - paused
    if pause_s > budget_s or source_digest != target_digest:
        # Roll back: the source serves again under a newer generation giving it back, told
        # first; the target forgets what it imported.
        install(source, generation + 1, before)
        install(target, generation + 1, before)
        ok(call("DELETE", f"{target}/internal/partitions/{partition}"))
        pause_s = time.monotonic() - paused
        return Moved(False, pause_s, source_digest, target_digest, prefetch_s, steps, carried)
    taken = install(target, generation, after)  # commit
    steps["commit"] = time.monotonic() - copied
    pause_s = time.monotonic() - paused
    assert partition in taken["serving"], taken
    one_owner(source, target)
    assert digest(source, partition) == source_digest  # nothing changed it after the pause
    ok(call("DELETE", f"{source}/internal/partitions/{partition}"))  # release
    return Moved(True, pause_s, source_digest, target_digest, prefetch_s, steps, carried)
