"""The delivery line's direct path renders what structlog would, and honours the config."""

from __future__ import annotations

import json

import pytest
import structlog

from dispatcher.observe import logs

FIELDS = {
    "binding": "b",
    "outcome": "delivered",
    "ce_id": "id-1",
    "ce_type": "t",
    "ce_source": "/s",
    "attempts": 2,
    "status": 202,
    "duration_ms": 1.5,
    "redelivered": False,
    "reason": 'quote " and caf\u00e9',
}


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    structlog.contextvars.clear_contextvars()
    logs.configure("debug", "json")  # as tests/conftest.py sets it for the whole suite


def test_direct_json_line_equals_structlogs(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    structlog.contextvars.bind_contextvars(binding="b", extra="ctx")
    logs.get_logger().info("delivery", **FIELDS)
    written(FIELDS)
    via_structlog, direct = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert via_structlog.pop("timestamp").endswith("Z") and direct.pop("timestamp").endswith("Z")
    assert direct == via_structlog


def test_console_format_and_levels_go_through_structlog(capsys) -> None:
    logs.configure("info", "console")
    written(FIELDS)
    out = capsys.readouterr().out
    assert "delivery" in out and "ce_id=id-1" in out and not out.startswith("{")
    logs.configure("warning", "json")
    assert written(FIELDS) == 1  # filtered out, and the counter still moves
    assert capsys.readouterr().out == ""


def written(fields: dict[str, object]) -> int:
    """Add one line and flush; how many follow-ups ran."""
    lines = logs.DeliveryLines()
    ran: list[int] = []
    lines.add(fields, lambda: ran.append(1))
    lines.flush()
    return len(ran)


def test_lines_of_a_batch_are_out_before_their_counters_move(capsys) -> None:
    logs.configure("info", "json")
    lines = logs.DeliveryLines()
    seen: list[int] = []
    for n in range(3):
        lines.add(
            {**FIELDS, "ce_id": f"id-{n}"}, lambda: seen.append(capsys.readouterr().out.count("\n"))
        )
    assert capsys.readouterr().out == ""  # nothing written before the flush
    lines.flush()
    assert seen == [3, 0, 0]  # the first counter moved with all three lines already out


def test_lines_from_several_threads_never_share_a_line(monkeypatch, tmp_path) -> None:
    """Every log line reaches stdout whole: structlog lines from any thread and the
    engine's delivery batches interleave only between lines. With stdout
    unbuffered (PYTHONUNBUFFERED=1, as in the image) ``print`` wrote the text and
    the newline with two syscalls, and a batch written in between made one line
    of two JSON objects, which ``report`` cannot read."""
    import io
    import sys
    import threading

    path = tmp_path / "stdout"
    out = io.TextIOWrapper(io.FileIO(path, "w"), write_through=True)  # python -u's stdout
    monkeypatch.setattr(sys, "stdout", out)
    logs.configure("info", "json")
    log = logs.get_logger()

    def structlog_lines() -> None:
        for n in range(6000):
            log.info("tick", n=n)

    def delivery_batches() -> None:
        lines = logs.DeliveryLines()
        for _ in range(1200):
            for _ in range(5):
                lines.add(dict(FIELDS), lambda: None)
            lines.flush()

    threads = [threading.Thread(target=structlog_lines) for _ in range(2)]
    threads.append(threading.Thread(target=delivery_batches))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.close()
    written = path.read_text().split("\n")
    assert written[-1] == ""
    broken = [line for line in written[:-1] if not _one_object(line)]
    assert not broken, f"{len(broken)} lines are not one JSON object, e.g. {broken[0]!r}"
    assert len(written) - 1 == 2 * 6000 + 1200 * 5


def _one_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_a_full_pipe_holds_lines_then_drops_whole_ones_and_says_how_many(monkeypatch) -> None:
    """Never blocks, never half a line: held up to the bound, then dropped and counted,
    and once the pipe drains the held lines go out, then one line with the count."""
    import os
    import sys

    from dispatcher.loop import WRITABLE, Loop
    from dispatcher.observe import log_output
    from tests.support.loops import run_until

    read_end, write_end = os.pipe()
    monkeypatch.setattr(log_output, "PENDING_MAX", 10_000)
    monkeypatch.setattr(sys, "stdout", os.fdopen(write_end, "w"))

    def say_dropped(dropped: int) -> None:  # through this output, as the service's does
        output.write(json.dumps({"event": "log lines dropped", "dropped": dropped}) + "\n")

    output, loop = log_output.Output(say_dropped), Loop()
    try:
        assert output.attach(loop, WRITABLE)
        line = '{"event": "x", "pad": "%s"}\n' % ("p" * 70)  # 100 bytes
        for _ in range(2_000):  # 200 KB: more than the pipe (64 KiB) and the bound
            output.write(line)  # returns at once: the test would hang otherwise
        assert output.dropped > 0
        received = bytearray()

        def drained() -> bool:
            while True:
                try:
                    chunk = os.read(read_end, 65536)
                except BlockingIOError:
                    break
                received.extend(chunk)
            return b"log lines dropped" in received

        os.set_blocking(read_end, False)
        run_until(loop, drained, 10, "the held lines and the count")
    finally:
        output.detach()
        loop.close()
        os.close(read_end)
    lines = received.decode().splitlines()
    assert lines[:-1] == [line.rstrip("\n")] * (2_000 - output.dropped)
    assert json.loads(lines[-1])["dropped"] == output.dropped


def test_the_dropped_count_is_said_whatever_the_log_level(capsys) -> None:
    """Lines were lost: the count goes out at error level, which every
    ``logging.level`` lets through."""
    logs.configure(level="error", fmt="json")
    try:
        logs.get_logger().warning("hidden at this level")
        logs.say_dropped(3)
    finally:
        logs.configure()
    [line] = capsys.readouterr().out.splitlines()
    said = json.loads(line)
    assert (said["dropped"], said["level"]) == (3, "error")


def test_detach_with_the_reader_gone_ends_quietly_and_closes_its_descriptor(monkeypatch) -> None:
    """A log reader that died (``| head``): lines still waiting cannot go out; the
    shutdown must neither raise nor keep the descriptor."""
    import os
    import sys

    from dispatcher.loop import WRITABLE, Loop
    from dispatcher.observe import log_output

    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdout", os.fdopen(write_end, "w"))
    output, loop = log_output.Output(lambda _n: None), Loop()
    try:
        assert output.attach(loop, WRITABLE)
        fd = output._fd
        assert fd is not None
        for _ in range(1_000):  # 100 KB: more than the pipe takes, the rest waits
            output.write('{"event": "x", "pad": "%s"}\n' % ("p" * 70))
        os.close(read_end)  # the reader goes away
        output.detach()  # a broken pipe: no exception
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
    finally:
        loop.close()
