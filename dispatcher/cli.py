"""Command line: ``dispatcher run`` and ``dispatcher check``.

Exit codes are the contract's: 0 clean stop or valid config, 2 bad config or
usage, 1 crash. A config error is one line on stderr naming the key; no
traceback. Signal handlers only set flags; a second signal exits at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from dispatcher import __version__
from dispatcher.config import Settings, load_settings, render_effective_config
from dispatcher.errors import ConfigError

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"dispatcher: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dispatcher", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dispatcher {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "run the service until SIGTERM/SIGINT"),
        ("check", "validate the config and print the effective config, secrets redacted"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument(
            "--config",
            metavar="PATH",
            help="config file (default: $DISPATCHER_CONFIG, else config/dispatcher.yaml)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings(args.config, os.environ)
    except ConfigError as e:
        sys.stderr.write(f"dispatcher: {e}\n")
        return EXIT_USAGE
    if args.command == "check":
        sys.stdout.write(render_effective_config(settings))
        return EXIT_OK
    return _run(settings)


def _run(settings: Settings) -> int:
    # Imported here so `check` stays fast and never touches the network stack.
    from dispatcher import logs
    from dispatcher.service import Service

    logs.configure(settings.logging.level, settings.logging.format)
    try:
        service = Service(settings)
    except ConfigError as e:
        sys.stderr.write(f"dispatcher: {e}\n")
        return EXIT_USAGE
    _install_signal_handlers(service)
    try:
        service.run()
    except Exception:
        logs.get_logger().exception("crashed")
        return EXIT_CRASH
    return EXIT_OK


def _install_signal_handlers(service: object) -> None:
    from dispatcher.service import Service

    assert isinstance(service, Service)
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if received:
            os._exit(EXIT_CRASH)  # second signal: the operator wants out now
        received.append(signum)
        service.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
