"""Structured JSON logs on stderr, one object per line, for our code and every library.

Invariant: every line carries `service` and `instance`; library loggers (uvicorn, aiokafka) are
routed through the same renderer so a log shipper sees one format.
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def configure_logging(service: str, instance: str, level: str = "info") -> None:
    """Install the JSON renderer on the root logger and bind `service` and `instance`."""
    numeric = _LEVELS.get(level, logging.ERROR)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
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
