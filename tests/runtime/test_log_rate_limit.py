"""Repeated log events are rate-limited (`relay_runtime.logs.RateLimit`, issue 19): a client that
makes the server log one line per bad request or refused connection cannot fill the disk."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from relay_runtime import logs
from relay_runtime.logs import RateLimit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_at_most_n_per_event_per_second_then_one_summary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    limit = RateLimit(5, clock=clock)
    summaries: list[tuple[str, int]] = []
    monkeypatch.setattr(limit, "summarise", lambda key, n: summaries.append((key, n)))
    assert [limit.admit("flood") for _ in range(1000)].count(True) == 5
    assert limit.admit("other")  # each event has its own budget
    assert summaries == []
    clock.now += 1.0
    assert limit.admit("flood")  # a new window; the last one's count goes out once
    assert summaries == [("flood", 995)]
    assert [limit.admit("flood") for _ in range(10)].count(True) == 4
    clock.now += 1.5
    assert limit.admit("quiet")  # any line a second later reports what other events dropped
    assert summaries == [("flood", 995), ("flood", 6)]


def test_keys_stay_bounded() -> None:
    limit = RateLimit(1, max_keys=100)
    for n in range(10_000):
        limit.admit(f"event-{n}")
    assert len(limit.windows) <= 100


@pytest.fixture
def output() -> Iterator[io.StringIO]:
    """What `configure_logging`'s handler writes (10 lines per event per second)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure_logging("test", "test-1", "info", events_per_s=10)
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    yield stream
    structlog.reset_defaults()
    root.handlers[:], level = saved
    root.setLevel(level)


def lines(output: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.getvalue().splitlines() if line]


def test_structlog_and_library_lines_are_limited(
    output: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frozen clock: the 10,000 lines fall in one window however slowly the machine runs
    # (on a loaded machine the loop took over a second and a second window let 10 more through).
    limit = next(f for f in logging.getLogger().handlers[0].filters if isinstance(f, RateLimit))
    monkeypatch.setattr(limit, "clock", Clock())
    limit.windows.clear()
    log = structlog.get_logger("relay.test")
    for n in range(10_000):
        log.warning("bad_frame", n=n)
        # asyncio's refused-accept line, once per failed accept (issue 19: 335,610 in ~60 s)
        logging.getLogger("asyncio").error("socket.accept() out of system resource %d", n)
    written = lines(output)
    assert sum(line["event"] == "bad_frame" for line in written) == 10
    assert sum(str(line["event"]).startswith("socket.accept()") for line in written) == 10
    assert len(written) == 20


def test_the_summary_line_counts_what_was_dropped(
    output: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    limit = next(f for f in logging.getLogger().handlers[0].filters if isinstance(f, RateLimit))
    monkeypatch.setattr(limit, "clock", clock)
    limit.windows.clear()
    log = structlog.get_logger("relay.test")
    for _ in range(50):
        log.info("connection_refused")
    clock.now += 1.0
    log.info("connection_refused")
    written = lines(output)
    summary = [line for line in written if line["event"] == logs.SUMMARY_EVENT]
    assert len(summary) == 1
    assert (summary[0]["of"], summary[0]["suppressed"]) == ("connection_refused", 40)
    assert sum(line["event"] == "connection_refused" for line in written) == 11
