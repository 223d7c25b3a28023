"""Every error dispatcher raises on purpose, in one tree.

Third-party errors (pika, libcurl, redis, sockets, yaml, cloudevents, OS
errors on files) are translated into these where they enter the package, and
nowhere else::

    DispatcherError
    ├── ConfigError            bad configuration; names the key; exit code 2
    ├── TokenFileError         a bearer token file gives no token (at start the
    │                          caller makes it a ConfigError naming the key; later
    │                          the last good token is kept)
    ├── EventError             a message that cannot become a valid CloudEvent
    │   └── NotACloudEvent     no specversion at all (wrap it or dead-letter it)
    ├── BatchInputError        a batch command cannot start: missing input, no PySpark,
    │                          an exchange or queue that does not exist; exit code 2
    └── BatchFailed            a batch command started but could not finish its work:
                               a lost broker, a full disk, unconfirmed publishes, a
                               signal; exit code 1

What is *not* an exception, because the code that meets it decides what
happens next and must not be unwound past the ack decision:

- a lost consuming connection or channel: the supervisor turns pika's close
  notifications into reconnect reasons (the ``reason`` label of
  ``dispatcher_reconnects_total``);
- a failed HTTP attempt: a ``seams.Response`` whose ``status`` is ``None``
  and whose ``error`` says what happened (a timeout, a refused connection);
- an unconfirmed or returned publish: the publish's answer is the reason as a
  string (``None`` when the broker confirmed it);
- a shared dedupe store that does not answer: the claim's answer is ``None``,
  and memory decides as without a store.

``ValueError``/``RuntimeError`` raised inside the package mean a bug in the
caller (a publisher built with no nodes, a future read before it resolved),
not bad input.
"""

from __future__ import annotations

from collections.abc import Sequence


class DispatcherError(Exception):
    """Root of every error dispatcher raises on purpose."""


class ConfigError(DispatcherError):
    """Invalid configuration. ``str(err)`` is ``"<key>: <problem>"``, one line per
    problem when a file has several: ``key``/``problem`` are the first, ``problems``
    all of them, in the order of the keys' declarations."""

    def __init__(self, key: str, problem: str, more: Sequence[tuple[str, str]] = ()) -> None:
        self.problems = ((key, problem), *more)
        super().__init__("\n".join(f"{k}: {p}" if k else p for k, p in self.problems))
        self.key = key
        self.problem = problem


class TokenFileError(DispatcherError):
    """A bearer token file cannot give a token; ``str()`` says why (never the token)."""


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
