"""structlog configuration: JSON lines on stdout (or console).

The ``delivery`` line is written once per message, so it has a direct path
(``DeliveryLines``): in JSON format it is the same line structlog would
render, built with one cached JSON encoder instead of a processor chain and
a new bound logger per call. The engine writes the lines of one loop
iteration with one ``write`` (a syscall each per line was about 10 us of a
delivery's CPU); an iteration lasts a millisecond or so, so lines still
appear as they happen. Where the bytes go, and why a stdout nobody reads
never stops the loop, is ``log_output``'s.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Any, cast

import structlog
from structlog.typing import FilteringBoundLogger

from dispatcher.observe.log_output import Output


def say_dropped(dropped: int) -> None:
    """The one line that says how many lines a stdout nobody read cost. Logs were
    lost: at error level, the one that every ``logging.level`` lets through."""
    get_logger().error("log lines dropped: stdout was not read", dropped=dropped)


# Every line of the process goes out through this, text and newline in one write
# under one lock (a line written in two could take another thread's lines into its
# middle), without blocking the engine loop once a service attaches it.
OUTPUT = Output(say_dropped)


def write_lines(text: str) -> None:
    """Write ``text`` (whole lines, each ending in a newline) to stdout at once."""
    OUTPUT.write(text)


class _LineLogger:
    """structlog's output: one ``write_lines`` per rendered line."""

    def msg(self, message: str) -> None:
        write_lines(message + "\n")

    log = debug = info = warn = warning = error = err = critical = fatal = exception = msg


_LINE_LOGGER = _LineLogger()


def _line_logger(*_args: Any) -> _LineLogger:
    return _LINE_LOGGER


class _Direct:
    """What ``configure`` set, for the direct path: JSON lines at info or below."""

    json = False


_direct = _Direct()


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
        # Each line one write under one lock, to the current sys.stdout (write_lines).
        logger_factory=_line_logger,
        cache_logger_on_first_use=False,
    )
    _direct.json = (
        fmt != "console" and logging.getLevelNamesMapping()[level.upper()] <= logging.INFO
    )
    # pika logs connection trouble at WARNING/ERROR through stdlib logging; our
    # own lifecycle lines say the same with the reason, so keep pika quiet.
    logging.getLogger("pika").setLevel(logging.CRITICAL)
    # The OTLP exporter says each failed export through stdlib logging; our own
    # line says when export fails and when it works again (``otlp``).
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)


def get_logger(**initial: Any) -> FilteringBoundLogger:
    """The package's logger: structlog's filtering bound logger (``configure``
    sets its level and renderer); lines are ``log.info("what", field=value)``."""
    return cast(FilteringBoundLogger, structlog.get_logger("dispatcher", **initial))


def bind_trace(trace_id: str, span_id: str) -> None:
    """Every line logged from here on in this context (one delivery's task) carries
    the delivery's trace: the ``delivery`` line and any other about it."""
    structlog.contextvars.bind_contextvars(trace_id=trace_id, span_id=span_id)


_ENCODER = json.JSONEncoder(default=repr)


class DeliveryLines:
    """The ``event: "delivery"`` lines of final outcomes, written in batches.

    ``add`` keeps a line with what must happen once it is out (the outcome
    counter: whoever waits on the counter can rely on the line); ``flush``
    renders and writes every kept line, then runs those. The lines of one
    batch share the timestamp of their writing (one loop iteration: within a
    millisecond of each outcome). When the level is above info (structlog then
    drops the line), the format is console, or the line itself is a warning
    (a ``rejected`` outcome), it goes through structlog at once.
    """

    def __init__(self) -> None:
        self._lines: list[dict[str, Any]] = []
        self._then: list[Callable[[], object]] = []

    def add(self, fields: dict[str, Any], then: Callable[[], object], level: str = "info") -> None:
        """``level``: ``info``, or ``warning`` for an outcome someone should look at."""
        if not _direct.json or level != "info":
            getattr(get_logger(), level)("delivery", **fields)
            then()
            return
        context = structlog.contextvars.get_contextvars()
        line = {**context, **fields} if context else fields
        line["event"] = "delivery"
        line["level"] = "info"
        self._lines.append(line)
        self._then.append(then)

    def flush(self) -> None:
        if not self._then:
            return
        lines, then = self._lines, self._then
        self._lines, self._then = [], []
        # Lines and callbacks are kept together: some of both, never one alone.
        timestamp = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
        encode = _ENCODER.encode
        parts = []
        for line in lines:
            line["timestamp"] = timestamp
            parts.append(encode(line))
        parts.append("")
        write_lines("\n".join(parts))
        for callback in then:
            callback()
