"""The engine's event loop: futures, tasks, timers, the thread-safe inbox, shutdown waits."""

from __future__ import annotations

import os
import threading
import time
from typing import TypeVar

import pytest
import structlog

from dispatcher import loop as loop_module
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Future, Loop

T = TypeVar("T")


async def awaiting(future: Future[T]) -> T:
    return await future


@pytest.fixture
def loop():
    made = Loop()
    yield made
    made.close()


def test_the_first_resolution_wins(loop):
    future: Future[str] = loop.create_future()
    seen: list[str] = []
    future.on_done(seen.append)
    assert future.resolve("confirmed")
    assert not future.resolve("timed out")  # a late answer changes nothing

    async def read() -> str:
        return await future

    assert loop.run_until_complete(read()) == "confirmed"
    assert seen == ["confirmed"]


def test_a_callback_added_after_resolution_still_runs(loop):
    future: Future[int] = loop.create_future()
    future.resolve(7)
    seen: list[int] = []
    future.on_done(seen.append)
    loop.run_until_complete(awaiting(Waits(loop).sleep(0)))
    assert seen == [7]


def test_timers_run_in_time_order_and_cancelled_ones_do_not(loop):
    ran: list[str] = []
    loop.call_later(0.03, ran.append, "third")
    loop.call_later(0.01, ran.append, "first")
    loop.call_later(0.02, ran.append, "second")
    loop.call_later(0.015, ran.append, "cancelled").cancel()
    loop.run_until_complete(awaiting(Waits(loop).sleep(0.05)))
    assert ran == ["first", "second", "third"]


def test_a_timer_cancelled_by_a_callback_of_the_same_pass_does_not_run(loop):
    """A due timer's callback waited in the pass's ready list, beyond the reach of
    ``cancel``: pika's connection-lost notice, run first, cancels its heartbeat
    timer, which then sent on the closed connection (an error-level traceback)."""
    ran = []
    timer = loop.call_later(0.0, ran.append, "cancelled timer")
    loop.call_soon(timer.cancel)  # ready before the timer in the same pass
    loop.call_later(0.05, loop.request_stop)
    loop.run()
    assert ran == []


def test_each_task_has_a_context_of_its_own(loop):
    """structlog contextvars bound by one delivery never show in another's lines."""

    async def binds() -> None:
        structlog.contextvars.bind_contextvars(stray="from-the-first")
        await Waits(loop).sleep(0.01)

    async def reads() -> dict[str, object]:
        await Waits(loop).sleep(0.02)
        return structlog.contextvars.get_contextvars()

    async def both() -> dict[str, object]:
        loop.spawn(binds())
        return await loop.spawn(reads()).finished

    assert loop.run_until_complete(both()) == {}


def test_a_failing_callback_or_task_does_not_stop_the_loop(loop, capsys):
    def broken() -> None:
        raise RuntimeError("a bug")

    async def broken_task() -> None:
        raise RuntimeError("another bug")

    async def main() -> str:
        loop.call_soon(broken)
        assert await loop.spawn(broken_task()).finished is None
        await Waits(loop).sleep(0.01)
        return "still running"

    assert loop.run_until_complete(main()) == "still running"
    out = capsys.readouterr().out
    assert "engine callback failed" in out and "a delivery task failed" in out


def test_items_from_other_threads_wake_the_loop_once_per_batch(loop, monkeypatch):
    writes: list[bytes] = []
    real_write = loop_module.os.write

    def counting_write(fd: int, data: bytes) -> int:
        writes.append(data)
        return real_write(fd, data)

    monkeypatch.setattr(loop_module.os, "write", counting_write)
    received: list[int] = []
    release = threading.Event()

    def producer() -> None:
        for i in range(1000):
            loop.call_soon_threadsafe(received.append, i)
        release.set()

    async def main() -> None:
        threading.Thread(target=producer).start()
        while len(received) < 1000:
            await Waits(loop).sleep(0.001)

    loop.run_until_complete(main())
    assert received == list(range(1000))  # all of them, in order
    assert release.is_set()
    # One wake-up per batch: far fewer pipe writes than items.
    assert len(writes) < 100, len(writes)


def test_nothing_is_queued_once_the_loop_is_closed():
    closed = Loop()
    closed.close()
    assert closed.call_soon_threadsafe(print, "never") is False


def test_a_started_loop_stops_within_its_bound():
    running = Loop()
    running.start()
    seen = threading.Event()
    running.call_soon_threadsafe(lambda _arg: seen.set(), None)
    assert seen.wait(5)
    assert running.stop(timeout=5)
    assert running.thread is not None and not running.thread.is_alive()
    assert running.call_soon_threadsafe(print, "never") is False


def test_give_up_ends_every_wait_at_once(loop):
    waits = Waits(loop)
    never: Future[str] = loop.create_future()

    async def main() -> tuple[bool, str | None, bool, bool]:
        sleeping = loop.spawn(awaiting(waits.sleep(60)))
        waiting = loop.spawn(awaiting(waits.wait(never, 60)))
        loop.call_later(0.02, waits.give_up)
        slept = await sleeping.finished
        waited = await waiting.finished
        later = await waits.sleep(60)  # after give-up: at once
        short = await Waits(loop).sleep(0.01)  # another Waits is not affected
        return slept, waited, later, short

    started = time.monotonic()
    assert loop.run_until_complete(main()) == (False, None, False, True)
    assert time.monotonic() - started < 5


def test_a_wait_returns_the_awaited_value_or_none_on_timeout(loop):
    waits = Waits(loop)
    answered: Future[str] = loop.create_future()
    silent: Future[str] = loop.create_future()
    loop.call_later(0.01, answered.resolve, "yes")

    async def main() -> tuple[str | None, str | None]:
        return await waits.wait(answered, 5), await waits.wait(silent, 0.02)

    assert loop.run_until_complete(main()) == ("yes", None)


def test_iteration_end_hooks_run_during_a_long_iteration_and_at_its_end(loop):
    ran: list[int] = []
    seen: list[int] = []
    loop.at_iteration_end(lambda: seen.append(len(ran)))

    async def main() -> None:
        for n in range(100):
            loop.call_soon(ran.append, n)
        await Waits(loop).sleep(0)

    loop.run_until_complete(main())
    # The 100 callbacks ran in one pass: hooks after 32, 64 and 96 of them, and at the end.
    assert seen[:4] == [32, 64, 96, 100]


def test_a_resting_socket_closed_and_its_number_reused_is_watched_again(loop):
    """A socket left registered between requests (``rest``) may be closed by its owner;
    epoll forgets it then. A new socket that gets the same number must be watched,
    even when it asks for the same readiness the old one had."""
    import socket

    first, peer = socket.socketpair()
    number = first.fileno()
    loop.watch(number, loop_module.READABLE, lambda _fd, _ev: None)
    loop.rest(number)
    first.close()
    peer.close()
    second, writer = socket.socketpair()
    third = None
    if second.fileno() != number:  # make the new socket take the old number
        third = second
        os.dup2(third.fileno(), number)
        second = socket.socket(fileno=number)
    seen: list[int] = []

    def ready(fd: int, _events: int) -> None:
        seen.append(fd)
        loop.unwatch(fd)  # level-triggered: the unread byte would wake it again

    loop.watch(number, loop_module.READABLE, ready)
    writer.send(b"x")

    async def wait_for_it() -> None:
        for _ in range(200):
            if seen:
                return
            await awaiting(Waits(loop).sleep(0.005))

    loop.run_until_complete(wait_for_it())
    assert seen == [number]
    for s in (second, writer, third):
        if s is not None:
            s.close()
