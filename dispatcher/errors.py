"""The one exception hierarchy of dispatcher.

Third-party errors (pika, sockets, yaml, cloudevents) are translated into these
where they enter the package, and nowhere else::

    DispatcherError
    ├── ConfigError            bad configuration; names the key; exit code 2
    ├── EventError             a message that cannot become a valid CloudEvent
    │   └── NotACloudEvent     no specversion at all (wrap it or dead-letter it)
    ├── BatchInputError        a batch command cannot start: missing input, no PySpark,
    │                          an exchange or queue that does not exist; exit code 2
    └── BatchFailed            a batch command started but could not finish its work:
                               a lost broker, a full disk, unconfirmed publishes, a
                               signal; exit code 1

Losing the consuming connection or a channel is not an exception anywhere: the
supervisor turns pika's close notifications into reconnect reasons. Nor is a
failed HTTP attempt or an unconfirmed publish: on the engine's loop they are
values (``Response.status == -1`` with ``error``; the publish future's reason),
which the delivery code inspects.
"""

from __future__ import annotations


class DispatcherError(Exception):
    """Root of every error dispatcher raises on purpose."""


class ConfigError(DispatcherError):
    """Invalid configuration. ``str(err)`` is ``"<key>: <problem>"``."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


class EventError(DispatcherError):
    """The message claims to be a CloudEvent but is not a valid one; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotACloudEvent(EventError):
    """The message carries no CloudEvents ``specversion`` in any accepted form."""


class BatchInputError(DispatcherError):
    """A batch command (archive, report, replay) cannot start with what it was given."""


class BatchFailed(DispatcherError):
    """A batch command could not finish its work. ``summary``: what it did before, if
    anything (the command prints it on stdout, as after a run that finished)."""

    def __init__(self, message: str, summary: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.summary = summary
