"""Command line: ``dispatcher run``, ``check``, ``archive``, ``report`` and ``replay``.

Exit codes are the contract's: 0 clean stop or valid config, 2 bad config or
usage, 1 crash (for the batch commands: a run that could not finish its work).
The batch commands live in ``dispatcher.pipeline``; this module only parses
their arguments. A config error is one line on stderr naming the key; no
traceback. The first SIGTERM/SIGINT asks to stop, a second exits at once
(``dispatcher.signals``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dateutil.parser import isoparse

from dispatcher import __version__
from dispatcher.config import (
    BrokerSettings,
    Settings,
    advice,
    blame_variables,
    load_batch_settings,
    load_settings,
    parse_duration,
    render_effective_config,
)
from dispatcher.errors import BatchFailed, BatchInputError, ConfigError
from dispatcher.resolve import Resolved, check_batch, resolve
from dispatcher.signals import Signals

# Not taken from __doc__: ``python -OO`` strips docstrings.
_SUMMARY = "Delivers RabbitMQ messages as CloudEvents over HTTP; archives and replays them."

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"dispatcher: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dispatcher", description=_SUMMARY)
    parser.add_argument("--version", action="version", version=f"dispatcher {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the service until SIGTERM/SIGINT"),
        ("check", "validate the config and print the effective config, secrets redacted"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        _config_option(command)
    _batch_commands(commands)
    return parser


def _config_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $DISPATCHER_CONFIG, else config/dispatcher.yaml)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _duration(text: str) -> float:
    try:
        value = parse_duration(text, "duration")
    except ConfigError as e:
        raise argparse.ArgumentTypeError(e.problem) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _folder(text: str) -> str:
    # "" is the current directory to every file call: never what was meant.
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _short_string(text: str) -> str:
    # AMQP names are short strings: pika raises ShortStringTooLong past 255 bytes.
    if len(text.encode("utf-8")) > 255:
        raise argparse.ArgumentTypeError("must be at most 255 bytes (an AMQP short string)")
    return text


def _instant(text: str) -> dt.datetime:
    try:
        value = isoparse(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 date or timestamp: {text!r} (e.g. 2026-11-20T00:00:00Z)"
        ) from None
    # A bare date or a time without an offset is read as UTC, like the archive's folders.
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _batch_commands(commands: Any) -> None:
    archive = commands.add_parser(
        "archive",
        help="drain a queue into date-partitioned JSON-lines files of CloudEvents",
        description="Drain a queue (a dead-letter queue, typically) into OUT/date=YYYY-MM-DD/"
        "*.jsonl, one structured CloudEvent per line; a message is acked only after the "
        "file that holds it is written, fsynced and renamed into place.",
    )
    archive.add_argument("--queue", required=True, help="queue to drain (must exist)")
    archive.add_argument("--out", type=_folder, required=True, metavar="DIR", help="archive folder")
    archive.add_argument("--max-events", type=_positive_int, metavar="N", help="stop after N")
    archive.add_argument(
        "--idle-exit", type=_duration, metavar="DURATION", help="stop when idle this long"
    )
    archive.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="messages per written file at most, and the prefetch (default 1000)",
    )
    _config_option(archive)

    report = commands.add_parser(
        "report",
        help="Spark job: delivery analytics over the service's JSON delivery logs",
        description="Read delivery-log lines (files, folders, globs; plain or gzip) and write "
        "summary.csv, errors.csv, attempts.csv, the same tables as Parquet, summary.md and "
        "report.png into OUT.",
    )
    report.add_argument("--logs", required=True, nargs="+", metavar="PATH", help="log input")
    report.add_argument("--out", type=_folder, required=True, metavar="DIR", help="output folder")
    _config_option(report)  # its logging section

    replay = commands.add_parser(
        "replay",
        help="Spark job: republish archived events to RabbitMQ with publisher confirms",
        description="Republish the events of an archive (every *.jsonl and *.jsonl.gz below "
        "DIR) to an existing exchange: persistent, binary ce- headers, confirmed, one "
        "long-lived connection per Spark partition.",
    )
    replay.add_argument(
        "--archive", type=_folder, required=True, metavar="DIR", help="archive folder"
    )
    replay.add_argument(
        "--exchange",
        type=_short_string,
        required=True,
        help="exchange ('' = default); must exist",
    )
    replay.add_argument(
        "--routing-key", type=_short_string, default="", metavar="K", help="routing key"
    )
    replay.add_argument("--type", help="only events of this type")
    replay.add_argument("--source", help="only events from this source")
    replay.add_argument("--since", type=_instant, metavar="TS", help="from this instant (incl.)")
    replay.add_argument("--until", type=_instant, metavar="TS", help="before this instant")
    replay.add_argument("--rate", type=_positive_number, metavar="N", help="max events/s in all")
    replay.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="publishing partitions = broker connections (default: Spark's parallelism)",
    )
    replay.add_argument(
        "--out",
        type=_folder,
        metavar="DIR",
        help="where counts.json, rejects/ and failed/ go (default: ./replay-<UTC time>)",
    )
    _config_option(replay)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("archive", "report", "replay"):
        return _batch(args)
    # One resolve step for both: `check` refuses what `run` would, and `run`
    # builds the service from what it read.
    resolved: list[Resolved] = []
    try:
        settings = load_settings(args.config, os.environ, lambda s: resolved.append(resolve(s)))
    except ConfigError as e:
        return _error(str(e), EXIT_USAGE)
    if args.command == "check":
        sys.stdout.write(render_effective_config(settings))
        for said in advice(settings, os.environ):  # valid, so still exit 0
            sys.stderr.write(f"dispatcher: warning: {said}\n")
        return EXIT_OK
    return _run(settings, resolved[0])


# (args, broker settings, the stop request) -> the summary printed on stdout.
_Job = Callable[[argparse.Namespace, BrokerSettings, threading.Event], str]


def _batch(args: argparse.Namespace) -> int:
    """``archive``, ``report`` and ``replay`` in one frame, the same as ``run``'s:
    logging from the config (the file's ``logging`` section, then ``LOG_LEVEL`` and
    ``LOG_FORMAT``), the first SIGTERM/SIGINT asks the job to stop (Spark jobs are
    cancelled) and a second exits at once, errors are one ``dispatcher: `` line on
    stderr, exit codes are the contract's: 0 done, 2 cannot start, 1 not finished."""
    from dispatcher.observe import logs

    try:
        # report publishes nothing: a broker setting it cannot use must not stop it.
        sections = ("logging",) if args.command == "report" else ("broker", "logging")
        check = check_batch if "broker" in sections else None
        settings = load_batch_settings(args.config, os.environ, sections, check)
    except ConfigError as e:
        return _error(str(e), EXIT_USAGE)
    logs.configure(settings.logging.level, settings.logging.format)
    job = _job(args.command)
    returned = threading.Event()
    on_first = None if args.command == "archive" else lambda: _cancel_spark_jobs(returned)
    try:
        with Signals(on_first) as signals:
            return _finish(args.command, job, args, settings.broker, signals.requested)
    finally:
        returned.set()


def _finish(
    command: str, job: _Job, args: argparse.Namespace, broker: BrokerSettings, stop: threading.Event
) -> int:
    """Run ``job`` and write its summary or error: inside the signal block, so a signal
    meanwhile is still taken by it, never by Python's default handler."""
    from dispatcher.observe import logs

    try:
        summary = job(args, broker, stop)
    except (ConfigError, BatchInputError) as e:
        return _error(str(e), EXIT_USAGE)
    except BatchFailed as e:
        if e.summary:
            sys.stdout.write(e.summary + "\n")
        return _error(e.message, EXIT_CRASH)
    except Exception as e:
        if stop.is_set():  # the cancelled Spark job's error, most likely
            return _error(f"{command} stopped by a signal before it finished", EXIT_CRASH)
        logs.get_logger().exception(f"{command} crashed")
        return _error(f"{command} crashed: {type(e).__name__}: {e}", EXIT_CRASH)
    sys.stdout.write(summary + "\n")
    sys.stdout.flush()
    return EXIT_OK


def _job(command: str) -> _Job:
    # Imported here so `check` and `run` never load the batch side (or PySpark).
    if command == "archive":
        from dispatcher.pipeline import archive

        return archive.command
    if command == "report":
        from dispatcher.pipeline import report

        return report.command
    from dispatcher.pipeline import replay

    return replay.command


def _cancel_spark_jobs(until: threading.Event) -> None:
    """The first signal during ``report`` or ``replay``: cancel every Spark job, the
    running one and any started later (between two actions, or once the JVM is up),
    until the command returns; its next action fails and it exits 1."""
    from dispatcher.pipeline.spark import cancel_all_jobs

    while True:
        cancel_all_jobs()
        if until.wait(0.2):
            return


def _error(message: str, code: int) -> int:
    # One line each: a configuration with several problems lists them all.
    sys.stderr.write("".join(f"dispatcher: {line}\n" for line in message.splitlines()))
    sys.stderr.flush()
    return code


def _run(settings: Settings, resolved: Resolved) -> int:
    # Imported here so `check` stays fast and never touches the network stack.
    from dispatcher.observe import logs
    from dispatcher.service import Service

    logs.configure(settings.logging.level, settings.logging.format)
    try:
        with Signals() as signals:
            try:
                service = Service(settings, resolved)
            except ConfigError as e:
                return _error(str(blame_variables(e, os.environ)), EXIT_USAGE)
            service.start()
            signals.requested.wait()
            service.request_stop()
            service.shutdown()
    except Exception:
        logs.get_logger().exception("crashed")
        return EXIT_CRASH
    return EXIT_OK
