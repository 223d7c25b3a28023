"""Driving a ``dispatcher.loop.Loop`` from a test's own thread."""

from __future__ import annotations

from collections.abc import Callable

from dispatcher.loop import Loop


def run_until(loop: Loop, condition: Callable[[], bool], timeout: float, message: str) -> None:
    """Run ``loop`` in this thread until ``condition()`` holds (checked every 50 ms):
    what the loop's connections do meanwhile (reconnects) happens as it would in the
    service, whose loop never stops."""

    async def poll() -> bool:
        deadline = loop.time() + timeout
        while not condition():
            if loop.time() > deadline:
                return False
            tick = loop.create_future()
            loop.call_later(0.05, tick.resolve, None)
            await tick
        return True

    assert loop.run_until_complete(poll()), f"timed out after {timeout}s waiting for {message}"


def close_on_loop(loop: Loop, close: Callable[[], None]) -> None:
    """``close`` (which waits for the loop to act on it) with the loop running on a
    thread of its own meanwhile, then the loop closed."""
    loop.start()
    try:
        close()
    finally:
        loop.stop(3.0)
        loop.close()
