"""Invariant 4 for the loop's direct send: ``LoopConnection`` hands a pass's frames
to ``socket.send`` itself when pika has nothing buffered (``pika_loop._send_now``).
That is only safe on a non-blocking socket: a blocking one whose send buffer is
full (a broker that stops reading) would stop the loop, heartbeats included. The
unit tests make their socket pair non-blocking themselves; this checks that the
socket pika opens to a real broker is."""

from __future__ import annotations

import pika
import pytest
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

from dispatcher.broker.pika_loop import LoopConnection
from dispatcher.loop import Loop
from tests.support.broker import URL
from tests.support.loops import run_until

pytestmark = pytest.mark.broker


def test_the_socket_pika_connects_to_the_broker_never_blocks_a_send() -> None:
    loop = Loop()
    opened: list[object] = []
    connection = LoopConnection(loop, pika.URLParameters(URL), on_open_callback=opened.append)
    try:
        run_until(loop, lambda: bool(opened), 15, "the connection to open")
        transport = connection._transport
        assert type(transport) is _AsyncPlaintextTransport  # the path _send_now takes
        assert transport._sock.gettimeout() == 0.0  # non-blocking: send never waits
    finally:
        if connection.is_open:
            connection.close()
        run_until(loop, lambda: connection.is_closed, 15, "the connection to close")
        loop.close()
