"""What the conformance rows share (see the test modules and docs/conformance.md).

Each test is one row of ``docs/conformance.md``: a requirement of Knative's
data-plane (``test_data_plane.py``) or control-plane (``test_control_plane.py``)
specification that applies to what delivers a Trigger's (or a Subscription's)
events, checked black-box: a message published to RabbitMQ, and what the
subscriber, the dead-letter sink and the reply target receive.
"""

from __future__ import annotations

from typing import Any

REPLY_EVENT = {
    "ce-specversion": "1.0",
    "ce-id": "reply-1",
    "ce-source": "/subscriber",
    "ce-type": "dev.tests.reply",
    "content-type": "application/json",
}

# Short waits, so that a row with retries takes a fraction of a second.
FAST: dict[str, Any] = {"backoff_delay": "20ms", "backoff_max": "200ms", "timeout": "2s"}


def delivery(**overrides: Any) -> dict[str, Any]:
    return {**FAST, **overrides}
