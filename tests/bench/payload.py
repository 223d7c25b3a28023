"""The benchmark's event: a binary-mode CloudEvent with exactly 1,024 bytes of JSON data.

Shared by the bench (what it publishes) and the HTTP-only ceilings (what they
post). ``ce-benchpublished`` is a CloudEvent extension carrying the publish
time (epoch seconds): the dispatcher forwards extensions as HTTP headers, so
the subscriber sees it as ``ce-benchpublished`` whoever delivered the event.
"""

from __future__ import annotations

import json
from typing import Final

SOURCE: Final = "/bench"
TYPE: Final = "dev.dispatcher.bench"
CONTENT_TYPE: Final = "application/json"
PUBLISHED: Final = "ce-benchpublished"
_SHELL: Final = len(json.dumps({"pad": ""}).encode())
BODY: Final = json.dumps({"pad": "x" * (1024 - _SHELL)}).encode()
assert len(BODY) == 1024


def event_ids(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i:06d}" for i in range(count)]


def amqp_headers(event_id: str, published: float | None = None) -> dict[str, str]:
    headers = {"ce-specversion": "1.0", "ce-id": event_id, "ce-source": SOURCE, "ce-type": TYPE}
    if published is not None:
        headers[PUBLISHED] = f"{published:.6f}"
    return headers


def http_headers(event_id: str) -> dict[str, str]:
    return {**amqp_headers(event_id), "content-type": CONTENT_TYPE}
