"""Passwords never leave the configuration: how URLs and values appear in messages.

Every URL quoted in an error message, in ``dispatcher check``'s output or in a
log line goes through ``redact_url``; every value an error message quotes goes
through ``show``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

# A URL's scheme, "amqp://" or "rediss://": redaction works for any of them.
SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# Query parameters that carry a secret: redis-py reads a store's password from
# ``?password=``, and OpenTelemetry's HTTP conventions name the signed-URL keys
# (AWS, Google Cloud, Azure SAS) whose values a span must not show.
_SECRET_QUERY: Final = re.compile(
    r"([?&](?:password|sig|signature|x-goog-signature|awsaccesskeyid)=)[^&#]*", re.IGNORECASE
)


def redact_url(url: str) -> str:
    """``url`` with any userinfo password replaced by ``***`` (the user name is
    kept), and any secret query value (``redact_query``).

    People paste passwords without percent-encoding them, so a password may
    hold ``/``, ``?``, ``#``, ``@``, ``%``, spaces, even ``://``: RFC 3986's
    reading (the authority ends at the first ``/``) would show half of
    ``pa/ss``. So the password here is everything from the first ``:`` after
    ``scheme://`` to the *last* ``@`` of the whole string. A URL with no
    password but a ``:`` then an ``@`` later (``http://h:8080/a@b``) reads as
    one and gets masked: hiding too much is the safe mistake. Without a
    ``scheme://`` (``user:pw@host``, ``//user:pw@host``, a user's typo) the
    same rule applies from the start of the string, but for ``mailto:``.
    """
    url = redact_query(url)
    scheme = SCHEME.search(url)
    start = scheme.end() if scheme is not None else 0
    if scheme is None and url[:7].lower() == "mailto:":
        return url  # "mailto:a@b" holds an address, not user:password
    at = url.rfind("@", start)
    colon = url.find(":", start, at)
    if at < 0 or colon < 0:
        return url  # no "@", or a user name alone: nothing secret
    return f"{url[: colon + 1]}***{url[at:]}"


def redact_query(url: str, mask: str = "***") -> str:
    """``url`` with the values of query parameters that carry a secret masked
    (``?password=``, signed-URL signatures); the rest of the query is kept."""
    return _SECRET_QUERY.sub(lambda found: found.group(1) + mask, url)


def redact_text(text: str) -> str:
    """Free text (a YAML parser's message) with any ``scheme://user:pw@`` masked.

    From the first URL on, the text is read as one URL (``redact_url``): a
    password may hold spaces or ``://``, so no shorter cut is safe. Text
    without ``://`` is left alone: ``found character '@'`` is no secret.
    """
    return redact_url(text) if SCHEME.search(text) else text


def show(value: object) -> str:
    """A value for an error message: strings quoted and redacted, containers by kind."""
    if isinstance(value, str):
        # The value may be a URL without its scheme (RABBITMQ_URL=user:pw@host).
        text = redact_url(value)
        return repr(text if len(text) <= 80 else text[:77] + "...")
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null / true / false, as the user wrote them in YAML
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, Mapping):
        return "mapping"
    return "list" if isinstance(value, list | tuple) else type(value).__name__
