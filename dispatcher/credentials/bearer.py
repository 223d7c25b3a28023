"""``auth.bearer_token_file``: a token kept current from a file, sent as a header.

Kubernetes projects a service-account token into a file and rotates it about
every hour; a dispatcher that runs for weeks must follow without a restart,
and without reading the file for every request (thousands a second).

So each request stats the file (a few microseconds, no read) and reads it only
when its identity changed (``file_identity``: a file modified within
``RACY_SECONDS`` of the clock is read again by the next request, until it is
steady). A file that is empty or holds junk is remembered the same way: read
again when it changes, not per request.

The file is read at start, by the configuration (missing, empty or not a
header value: a ``ConfigError``). If it later disappears, empties or holds
junk, the last good token stays in use: one warning says so, and one info
line says when a good token is read again.

A ``BearerToken`` is used by the engine's loop thread only.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Final

from dispatcher.credentials.file_identity import Identity, identity, steady
from dispatcher.errors import TokenFileError
from dispatcher.observe.logs import get_logger

log = get_logger()

MAX_TOKEN_BYTES: Final = 64 * 1024
# What an HTTP header value can carry (visible ASCII and inner spaces); a JWT
# is far narrower, but an opaque token is the issuer's business.
_TOKEN: Final = re.compile(r"[!-~]([ -~]*[!-~])?")


def read_token(path: str) -> str:
    """The token in ``path``, surrounding whitespace (a trailing newline) removed."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as e:
        raise TokenFileError(_reason(e)) from e
    if len(raw) > MAX_TOKEN_BYTES:
        raise TokenFileError(f"larger than {MAX_TOKEN_BYTES} bytes")
    token = raw.strip().decode("ascii", errors="replace")
    if not token:
        raise TokenFileError("empty")
    if not _TOKEN.fullmatch(token):
        raise TokenFileError("holds characters an HTTP header cannot carry")
    return token


class BearerToken:
    """``header()``: the ``Authorization: Bearer`` line with the file's current token."""

    def __init__(self, path: str, binding: str, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock  # wall clock: it is compared with file times
        self._log = log.bind(binding=binding, path=path)
        self._failing = False
        try:
            st = os.stat(path)
        except OSError as e:
            raise TokenFileError(_reason(e)) from e
        self._header = _header(read_token(path))  # a TokenFileError: the caller's config error
        self._signature: Identity | None = steady(st, self._clock())

    def header(self) -> str:
        try:
            st = os.stat(self._path)
        except OSError as e:
            self._signature = None
            self._failed(_reason(e))
            return self._header
        if identity(st) != self._signature:
            self._load(st)
        return self._header

    def _load(self, st: os.stat_result) -> None:
        """Read the file ``st`` described. A bad file is remembered like a good one,
        so it too is read again only when it changes."""
        try:
            self._header = _header(read_token(self._path))
        except TokenFileError as e:
            self._failed(str(e))
        else:
            if self._failing:
                self._failing = False
                self._log.info("bearer token file readable again")
        # The stat taken before the read: a change after it shows in the next one.
        self._signature = steady(st, self._clock())

    def _failed(self, reason: str) -> None:
        if not self._failing:
            self._log.warning("bearer token file unreadable; keeping the last token", error=reason)
        self._failing = True


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _header(token: str) -> str:
    return f"Authorization: Bearer {token}"
