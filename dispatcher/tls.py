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


def tls_context(tls: TlsSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context
