"""pika on the engine loop: the adapter's contract, and one write per loop pass."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pika
import pytest
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport
from pika.adapters.utils.selector_ioloop_adapter import SelectorIOServicesAdapter

from dispatcher.broker.pika_loop import LoopConnection, PikaLoop, close_within
from dispatcher.loop import FAILED, READABLE, WRITABLE, Loop
from tests.support.loops import run_until


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def test_the_frames_of_one_pass_leave_in_one_write() -> None:
    loop = Loop()
    try:
        connection = LoopConnection(
            loop, pika.ConnectionParameters("127.0.0.1", 1), internal_connection_workflow=False
        )
        transport = _Transport()
        connection._transport = transport
        for frame in (b"ack-1", b"ack-2", b"ack-3"):
            connection._adapter_emit_data(frame)
        assert transport.writes == []  # not one send per frame
        run_until(loop, lambda: bool(transport.writes), 5, "the write")
        connection._adapter_emit_data(b"ack-4")
        run_until(loop, lambda: len(transport.writes) == 2, 5, "the next pass's write")
        assert transport.writes == [b"ack-1ack-2ack-3", b"ack-4"]
    finally:
        loop.close()


class _Protocol:
    """What pika's transport reports to its connection."""

    def __init__(self) -> None:
        self.lost: list[BaseException | None] = []

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> None:
        pass

    def connection_lost(self, error: BaseException | None) -> None:
        self.lost.append(error)


@pytest.fixture
def wired() -> Iterator[tuple[Loop, LoopConnection, _AsyncPlaintextTransport, socket.socket]]:
    """A ``LoopConnection`` whose stream is pika's own plaintext transport over one end
    of a socket pair (small buffers, so a large write cannot go out at once); the
    other end is the broker's."""
    ours, broker = socket.socketpair()
    for end in (ours, broker):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ours.setblocking(False)
    loop = Loop()
    connection = LoopConnection(
        loop, pika.ConnectionParameters("127.0.0.1", 1), internal_connection_workflow=False
    )
    transport = _AsyncPlaintextTransport(
        ours, _Protocol(), SelectorIOServicesAdapter(PikaLoop(loop))
    )
    connection._transport = transport
    try:
        yield loop, connection, transport, broker
    finally:
        loop.unwatch(ours.fileno())
        ours.close()
        broker.close()
        loop.close()


def _received(broker: socket.socket, size: int, loop: Loop) -> bytes:
    """What the broker's end reads, ``size`` bytes, with the loop running between reads."""
    broker.setblocking(False)
    got = bytearray()

    def read() -> bool:
        with contextlib.suppress(BlockingIOError):
            while chunk := broker.recv(65536):
                got.extend(chunk)
        return len(got) >= size

    run_until(loop, read, 10, f"{size} bytes at the broker's end")
    return bytes(got)


def test_a_write_with_nothing_buffered_is_sent_at_once_without_a_writability_watch(
    wired: tuple[Loop, LoopConnection, _AsyncPlaintextTransport, socket.socket],
) -> None:
    """pika's own write would register for writability and send on a later pass: two
    epoll_ctl and a pass per write."""
    loop, connection, transport, broker = wired
    fd = transport._sock.fileno()
    connection._adapter_emit_data(b"ack-1")
    connection._adapter_emit_data(b"ack-2")
    connection._write_out()  # what the loop runs at the iteration's end
    assert broker.recv(100) == b"ack-1ack-2"  # already in the socket, no pass of the loop
    assert transport.get_write_buffer_size() == 0
    assert loop._watched[fd][0] == READABLE  # never watched for writability


def test_what_the_socket_does_not_take_goes_out_in_order_through_pikas_buffer(
    wired: tuple[Loop, LoopConnection, _AsyncPlaintextTransport, socket.socket],
) -> None:
    loop, connection, transport, broker = wired
    first = bytes(range(256)) * 256  # 64 KiB: more than the socket takes at once
    connection._adapter_emit_data(first)
    connection._write_out()
    assert 0 < transport.get_write_buffer_size() < len(first)  # part sent, the rest pika's
    # Written while pika still holds the rest: it must follow that rest, not overtake it.
    connection._adapter_emit_data(b"next")
    connection._write_out()
    assert _received(broker, len(first) + 4, loop) == first + b"next"
    assert transport.get_write_buffer_size() == 0


def test_a_send_that_fails_is_left_to_pika_which_aborts_the_connection(
    wired: tuple[Loop, LoopConnection, _AsyncPlaintextTransport, socket.socket],
) -> None:
    loop, connection, transport, _broker = wired
    transport._sock.shutdown(socket.SHUT_WR)  # every send now fails (EPIPE)
    connection._adapter_emit_data(b"ack-1")
    connection._write_out()  # does not raise: pika buffers it and meets the error itself
    assert transport.get_write_buffer_size() == len(b"ack-1")
    protocol = transport._protocol
    run_until(loop, lambda: bool(protocol.lost), 5, "pika to abort the connection")
    assert isinstance(protocol.lost[0], BrokenPipeError)


def test_handlers_see_pikas_masks_and_an_error_reads_the_socket() -> None:
    """A hang-up reported alone (no READ) still reaches pika as readable: its read
    then finds the end of the stream, instead of the poll reporting it for ever."""
    loop = Loop()
    ioloop = PikaLoop(loop)
    read_end, write_end = os.pipe()
    seen: list[int] = []
    try:
        assert (ioloop.READ, ioloop.WRITE, ioloop.ERROR) == (READABLE, WRITABLE, FAILED)
        ioloop.add_handler(read_end, lambda _fd, events: seen.append(events), ioloop.ERROR)
        os.close(write_end)  # the other end goes: POLLHUP
        run_until(loop, lambda: bool(seen), 5, "the hang-up")
        assert seen[0] & READABLE
        ioloop.remove_handler(read_end)
    finally:
        os.close(read_end)
        loop.close()


def test_a_handler_that_raises_breaks_only_its_connection() -> None:
    loop = Loop()
    ioloop = PikaLoop(loop)
    read_end, write_end = os.pipe()
    broken: list[bool] = []
    ioloop.on_broken = lambda: broken.append(True)

    def handler(_fd: int, _events: int) -> None:
        ioloop.remove_handler(read_end)
        raise RuntimeError("a bug inside pika's frame handling")

    try:
        ioloop.add_handler(read_end, handler, ioloop.READ)
        os.write(write_end, b"x")
        run_until(loop, lambda: bool(broken), 5, "the connection to be aborted")
    finally:
        os.close(read_end)
        os.close(write_end)
        loop.close()


@pytest.mark.parametrize("timeout", [0.2, 2.0])
def test_close_within_aborts_a_close_nobody_answers_and_keeps_its_bound(timeout: float) -> None:
    """FIELD-NOTES invariant 6: every teardown wait is bounded. A close the broker
    never answers gets the abort, and the whole wait stays within ``timeout``, short
    ones included."""
    loop = Loop()
    loop.start()
    calls: list[str] = []
    closed = threading.Event()
    try:
        started = time.monotonic()
        close_within(
            loop, lambda: calls.append("close"), lambda: calls.append("abort"), closed, timeout
        )
        took = time.monotonic() - started
    finally:
        loop.stop(3.0)
        loop.close()
    assert calls == ["close", "abort"]
    assert timeout * 0.9 <= took < timeout + 0.1
