"""Structured JSON logs on stderr, one object per line, for our code and every library.

Invariants: every line carries `service` and `instance`; library loggers (uvicorn, aiokafka,
asyncio) are routed through the same renderer so a log shipper sees one format; no event (by
name, or a library's message template) writes more than `events_per_s` lines a second: the rest
are counted and reported in one `log_suppressed` line, so a client cannot fill the disk by
repeating what gets logged (issue 19).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


SUMMARY_EVENT = "log_suppressed"


class RateLimit(logging.Filter):
    """At most `events_per_s` lines per event per one-second window; the rest are dropped and
    counted, and the count goes out as one `log_suppressed` line (`of`, `suppressed`) once the
    window has passed: at the event's next line, or at any line a second later.

    Both a structlog processor (keyed by event name) and a `logging.Filter` for library records
    (keyed by logger and message template, so formatted arguments do not make new keys).
    """

    def __init__(
        self,
        events_per_s: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        super().__init__()
        self.events_per_s = events_per_s
        self.clock = clock
        self.max_keys = max_keys
        self.windows: dict[str, list[float]] = {}
        """key -> [window start, lines let through, lines suppressed]"""
        self.last_sweep = clock()
        self.reporting = False

    def admit(self, key: str) -> bool:
        now = self.clock()
        if not self.reporting and now - self.last_sweep >= 1.0:
            self.last_sweep = now
            self.report(now)
        window = self.windows.get(key)
        if window is None or now - window[0] >= 1.0:
            if window is not None and window[2] and not self.reporting:
                self.summarise(key, int(window[2]))
            if window is None and len(self.windows) >= self.max_keys:
                self.report(now)
                self.windows.clear()
            self.windows[key] = [now, 1, 0]
            return True
        if window[1] < self.events_per_s or key == SUMMARY_EVENT:
            window[1] += 1
            return True
        window[2] += 1
        return False

    def report(self, now: float) -> None:
        """Summarise every key whose window has ended with lines suppressed."""
        for key, window in list(self.windows.items()):
            if window[2] and now - window[0] >= 1.0:
                self.summarise(key, int(window[2]))
                window[2] = 0

    def summarise(self, key: str, suppressed: int) -> None:
        self.reporting = True
        try:
            structlog.get_logger(__name__).warning(
                SUMMARY_EVENT, of=key, suppressed=suppressed, window_s=1.0
            )
        finally:
            self.reporting = False

    def __call__(
        self, _: Any, __: str, event_dict: structlog.types.EventDict
    ) -> structlog.types.EventDict:
        if not self.admit(str(event_dict.get("event"))):
            raise structlog.DropEvent
        return event_dict

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, dict):
            return True  # a structlog event, already admitted by the processor
        return self.admit(f"{record.name}: {record.msg}")


def configure_logging(
    service: str, instance: str, level: str = "info", events_per_s: int = 20
) -> None:
    """Install the JSON renderer on the root logger and bind `service` and `instance`; at most
    `events_per_s` lines per event per second (`RateLimit`)."""
    numeric = _LEVELS.get(level, logging.ERROR)
    limit = RateLimit(events_per_s)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            limit,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    handler.addFilter(limit)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # aiokafka logs every reconnect attempt at ERROR while a broker restarts; our own
    # readiness and warning lines already say that, once.
    logging.getLogger("aiokafka").setLevel(
        logging.DEBUG if numeric <= logging.DEBUG else logging.CRITICAL
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, instance=instance)
