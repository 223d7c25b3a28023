"""A TLS context from ``tls`` settings: these CAs (else the system's) and this
client certificate.

pika wraps an amqps connection in it (``broker.params``); for HTTP, libcurl
loads the same files itself, and the service builds one per binding at start
only so that a file that cannot be loaded is refused there, naming its key.
One function for both sides, so that neither imports the other's library.
"""

from __future__ import annotations

import ssl

from dispatcher.config import TlsSettings


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
