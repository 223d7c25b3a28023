"""Progress lines on a terminal, nothing elsewhere; replay's counts over UDP."""

from __future__ import annotations

import io
import socket
import time
from typing import Any

import pytest

from dispatcher.pipeline import progress
from dispatcher.pipeline.progress import ERASE, Progress, PublishedCounts, PublishedSender


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_written_when_stdout_is_not_a_terminal() -> None:
    stream = io.StringIO()
    shown = Progress(stream)
    shown.show(10, "events", "archived")
    with shown.polling(lambda: (1, "MB", "read")):
        pass
    shown.close()
    assert not shown.enabled
    assert stream.getvalue() == ""


def test_a_line_says_count_rate_and_elapsed_and_is_redrawn_at_most_four_times_a_second() -> None:
    stream, clock = Terminal(), Clock()
    shown = Progress(stream, clock)
    clock.now += 2.0
    shown.show(1000, "events", "archived")
    assert stream.getvalue() == f"{ERASE}1,000 events archived, 500 events/s, 0:02"
    clock.now += 0.1  # too soon: not drawn
    shown.show(1100, "events", "archived")
    assert stream.getvalue().count(ERASE) == 1
    clock.now += 3600.0
    shown.show(2_000_000, "events", "archived")
    assert stream.getvalue().endswith(f"{ERASE}2,000,000 events archived, 555 events/s, 1:00:02")
    shown.close()
    assert stream.getvalue().endswith(ERASE)  # erased: the summary starts on a clean line


def test_close_writes_nothing_when_nothing_was_drawn() -> None:
    stream = Terminal()
    Progress(stream).close()
    assert stream.getvalue() == ""


def test_polling_draws_what_the_reader_says_until_the_block_ends() -> None:
    stream = Terminal()
    read = iter(range(1, 1000))
    with Progress(stream).polling(lambda: (next(read), "MB", "read")):
        deadline = time.monotonic() + 10
        while ERASE + "2 MB read" not in stream.getvalue():
            assert time.monotonic() < deadline, stream.getvalue()
            time.sleep(0.01)  # polling the stream the reader thread writes to
    assert stream.getvalue().endswith(ERASE)


def test_a_reader_that_fails_costs_the_line_never_the_job() -> None:
    stream = Terminal()
    calls: list[int] = []

    def broken() -> tuple[float, str, str]:
        calls.append(1)
        raise RuntimeError("the status store went away")

    with Progress(stream).polling(broken):
        deadline = time.monotonic() + 10
        while len(calls) < 2:  # it polled, and failed, twice
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert stream.getvalue() == ""


def test_partitions_report_their_published_counts_to_the_driver() -> None:
    counts = PublishedCounts("127.0.0.1")
    try:
        first, second = PublishedSender(counts.address, 0), PublishedSender(counts.address, 1)
        first(10)
        first(20)  # within REDRAW_EVERY of the last: not sent
        second.close(5)
        first.close(30)  # the last count is always sent
        deadline = time.monotonic() + 10
        while counts.total() != 35:
            assert time.monotonic() < deadline, counts.total()
            time.sleep(0.01)
    finally:
        counts.close()


def test_a_driver_address_it_cannot_bind_is_refused_with_its_socket_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[socket.socket] = []

    class Recorded(socket.socket):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(progress.socket, "socket", Recorded)
    with pytest.raises(OSError):
        PublishedCounts("203.0.113.1")  # TEST-NET-3: no address of this machine
    assert len(made) == 1 and made[0].fileno() == -1
