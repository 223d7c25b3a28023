"""pika on the engine loop: the adapter's contract, and one write per loop pass."""

from __future__ import annotations

import os
import threading
import time

import pika
import pytest

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
