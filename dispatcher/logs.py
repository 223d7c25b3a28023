"""structlog configuration: JSON lines on stdout (or console), flushed per line."""

from __future__ import annotations

import logging
from typing import Any

import structlog


def configure(level: str = "info", fmt: str = "json") -> None:
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # PrintLogger flushes every line and writes to the current sys.stdout.
        logger_factory=structlog.PrintLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    # pika logs connection trouble at WARNING/ERROR through stdlib logging; our
    # own lifecycle lines say the same with the reason, so keep pika quiet.
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def get_logger(**initial: Any) -> Any:
    return structlog.get_logger("dispatcher", **initial)
