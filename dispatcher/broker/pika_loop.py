"""pika's connections on the engine's loop: one thread from socket to ack.

pika's ``SelectConnection`` takes any loop that implements its
``AbstractSelectorIOLoop`` (``custom_ioloop``): file descriptors with a
handler, timers, ``add_callback``. ``PikaLoop`` is that interface over
``dispatcher.loop.Loop``, so the consuming connection, the publishing
connection, libcurl's sockets and every delivery share one loop and one
thread. A verdict becomes a ``basic.ack`` in the iteration that reached it,
with no hand-over between threads.

The interface's ``start``, ``stop`` and ``close`` are left out: pika never
calls them (only a user of its own loop does), and the loop's owner runs and
closes ours.

``LoopConnection`` is the ``SelectConnection`` on such a loop, with one change
of pika's adapter method ``_adapter_emit_data``: pika writes every frame to
the socket with a ``send`` of its own, so 50 acks reached in one pass of the
loop were 50 system calls (14% of the loop's time at W1, measured with
py-spy). The frames of one iteration are joined and leave in one write at
its end, before the loop polls again (``Loop.flush_soon``): an ack is on
the wire in the iteration that reached its verdict.

That write is a ``send`` on the socket when pika has nothing buffered before
it (a plaintext connection; TLS keeps pika's path): pika's own ``write``
registers for writability and sends on a later pass, which cost two
``epoll_ctl`` and a pass of the loop per write (3-4% of the loop's time at
W2's steady 1,000 messages/s). What the socket does not take, and any error,
goes pika's way: it buffers the rest, and meets the error and aborts the
connection as it always did.

An exception escaping one of pika's handlers would leave its connection in a
state nobody knows; the loop logs it and the connection is aborted, so its
close callback rebuilds it (as an exception out of pika's own loop used to
end the connection's thread pass).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from pika.adapters.select_connection import SelectConnection
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

from dispatcher.loop import FAILED, READABLE, WRITABLE, Loop, Timer
from dispatcher.observe.logs import get_logger

log = get_logger()


class PikaLoop:
    """pika's ``AbstractSelectorIOLoop``, by its methods (pika only calls them)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self._handlers: dict[int, Callable[[int, int], None]] = {}
        self.on_broken: Callable[[], None] = lambda: None

    # pika's adapter reads the masks it passes to ``add_handler`` from these.
    @property
    def READ(self) -> int:
        return READABLE

    @property
    def WRITE(self) -> int:
        return WRITABLE

    @property
    def ERROR(self) -> int:
        return FAILED

    def add_handler(self, fd: int, handler: Callable[[int, int], None], events: int) -> None:
        self._handlers[fd] = handler
        self.loop.watch(fd, events, self._ready)

    def update_handler(self, fd: int, events: int) -> None:
        self.loop.watch(fd, events, self._ready)

    def remove_handler(self, fd: int) -> None:
        self._handlers.pop(fd, None)
        self.loop.unwatch(fd)

    def _ready(self, fd: int, events: int) -> None:
        handler = self._handlers.get(fd)
        if handler is None:
            return
        if events & FAILED:
            # pika ignores ERROR and HUP unless a read or write says it: let the
            # socket's own read report the failure instead of a poll that spins.
            events |= READABLE
        try:
            handler(fd, events)
        except Exception:
            log.exception("broker connection failed inside pika")
            self.on_broken()

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        return self.loop.call_later(delay, callback)

    def remove_timeout(self, timeout_handle: Timer) -> None:
        timeout_handle.cancel()

    def add_callback(self, callback: Callable[[], Any]) -> None:
        """pika's only thread-safe call: its name resolver answers from a thread."""
        if self.loop.on_loop_thread():
            self.loop.call_soon(callback)
        else:
            self.loop.call_soon_threadsafe(_call, callback)


def _call(callback: Callable[[], Any]) -> None:
    callback()


ABORT_BOUND = 0.5  # seconds an abort gets to release a socket the close did not


def close_within(
    loop: Loop,
    close: Callable[[], None],
    abort: Callable[[], None],
    closed: threading.Event,
    timeout: float,
) -> None:
    """From a thread other than the loop's: ``close`` on the loop and wait for
    ``closed``; a broker that does not answer the closing handshake in time (a
    black-holed network) gets ``abort``, so the socket is released on every path.
    The whole wait is bounded by ``timeout``."""
    if not loop.call_soon_threadsafe(lambda _arg: close(), None):
        return  # the loop has stopped: nothing runs on it any more
    for_abort = min(ABORT_BOUND, timeout / 2)
    if closed.wait(timeout - for_abort):
        return
    if loop.call_soon_threadsafe(lambda _arg: abort(), None):
        closed.wait(for_abort)


class LoopConnection(SelectConnection):  # type: ignore[misc]
    """pika's ``SelectConnection`` on ``loop``, its frames of one pass in one write."""

    def __init__(self, loop: Loop, parameters: Any, **callbacks: Any) -> None:
        self._out: list[bytes] = []
        self._out_loop = loop
        ioloop = PikaLoop(loop)
        ioloop.on_broken = self.abort
        super().__init__(parameters, custom_ioloop=ioloop, **callbacks)

    def _adapter_emit_data(self, data: bytes) -> None:
        if not self._out:
            self._out_loop.flush_soon(self._write_out)
        self._out.append(data)

    def _write_out(self) -> None:
        data = b"".join(self._out)
        self._out.clear()
        transport = self._transport
        if transport is None:
            return  # the stream is gone, and the frames with it
        sent = _send_now(transport, data)
        if sent < len(data):
            transport.write(data[sent:] if sent else data)

    def abort(self) -> None:
        """Drop the connection at once, without the closing handshake: its close (or
        open error) callback follows, as for a lost socket. Never raises."""
        with contextlib.suppress(Exception):  # already gone
            if not self.is_closed:
                self._adapter_disconnect_stream()  # pika's own way down: no public one


def _send_now(transport: Any, data: bytes) -> int:
    """How much of ``data`` the socket takes now, where pika would send it next
    anyway: an active plaintext transport with nothing buffered. 0 otherwise, and
    on any error (pika's own write then meets it)."""
    if (
        type(transport) is not _AsyncPlaintextTransport
        or transport.get_write_buffer_size()
        or transport._state != transport._STATE_ACTIVE
    ):
        return 0
    try:
        return int(transport._sock.send(data))
    except OSError:
        return 0
