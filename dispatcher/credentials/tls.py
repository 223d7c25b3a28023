"""A TLS context from ``tls`` settings: these CAs (else the system's) and this
client certificate.

pika wraps an amqps connection in it (``broker.params``); for HTTP, libcurl
loads the same files itself, and the service builds one per binding at start
only so that a file that cannot be loaded is refused there, naming its key.
One function for both sides, so that neither imports the other's library.
"""

from __future__ import annotations

import os
import ssl
import time

from dispatcher.config import TlsSettings
from dispatcher.credentials.file_identity import Identity, steady
from dispatcher.observe.logs import get_logger

log = get_logger()

_Stamp = tuple[Identity | str | None, ...]
_CHANGING = "changing"  # modified too recently to trust its identity (file_identity)


class EncryptedKey(ValueError):
    """The key file asks for a passphrase, and no setting gives one."""


def tls_context(tls: TlsSettings) -> ssl.SSLContext:
    """Raises ``OSError`` (``ssl.SSLError``) for a file that cannot be read or used,
    ``EncryptedKey`` for a key behind a passphrase: asked for none, OpenSSL would
    prompt on the terminal, and ``check`` or ``run`` wait there for good."""
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_no_passphrase)
    return context


def _no_passphrase() -> bytes:
    raise EncryptedKey(
        "the private key is encrypted (it asks for a passphrase, and none can be set): "
        "give it unencrypted, from a Secret"
    )


class ReloadingContext:
    """``tls_context(tls)``, built again when one of its files changed: a client
    certificate that cert-manager rotates (a Secret volume swaps a symlink) is
    used from the next connect on, not only after a restart. Asked for at each
    connect (a ``stat`` of up to three files). A file caught half-written, or
    one that cannot be used, keeps the previous context, said once a change."""

    def __init__(self, tls: TlsSettings) -> None:
        self._tls = tls
        self._stamp = self._stamps()
        self._context = tls_context(tls)
        self._refused: _Stamp | None = None  # the files' state last said unusable

    def current(self) -> ssl.SSLContext:
        stamp = self._stamps()
        if _CHANGING not in stamp and stamp in (self._stamp, self._refused):
            return self._context  # a file still changing is read again, as if changed
        try:
            context = tls_context(self._tls)
        except (OSError, EncryptedKey) as e:
            self._refused = stamp
            log.warning(
                "broker TLS files changed and cannot be used: the previous ones stay", error=str(e)
            )
            return self._context
        self._stamp, self._context, self._refused = stamp, context, None
        log.info("broker TLS files changed: reloaded")
        return self._context

    def _stamps(self) -> _Stamp:
        stamps: list[Identity | str | None] = []
        now = time.time()
        for path in (self._tls.ca_file, self._tls.cert_file, self._tls.key_file):
            if path is None:
                stamps.append(None)
                continue
            try:
                st = os.stat(path)  # through a symlink: what a Secret's swap changes
            except OSError as e:
                stamps.append(e.strerror or "unreadable")
                continue
            stamps.append(steady(st, now) or _CHANGING)
        return tuple(stamps)
