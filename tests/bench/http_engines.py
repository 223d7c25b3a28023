"""What one HTTP request costs in each engine: the measurement behind "Why libcurl".

    python tests/bench/http_engines.py [--requests N] [--concurrency C] [--repeat R]

Each engine posts N binary-mode CloudEvents (the bench's 1 KB event) to a local
nginx answering 202, C in flight, from a fresh process; it reports the CPU
time of its own process (user + system) per request and requests per second,
measured after a warm-up of 1,000 requests on the same connections. Median of
R runs, interleaved. nginx runs on the same 2 CPUs, as in the service bench.

Engines (those whose library is not installed are skipped):
- ``dispatcher``: ``dispatcher.http.client.HttpClient`` (libcurl's multi
  interface through pycurl) on ``dispatcher.loop``, a coroutine per request;
- ``pycurl-asyncio``: the same libcurl multi driven from asyncio
  (``add_reader``/``add_writer``/``call_later``, as tornado's curl client does);
- ``aiohttp``, ``aiohttp-uvloop``: ``aiohttp.ClientSession``, a task per request;
- ``httpx-async``: ``httpx.AsyncClient``, a task per request;
- ``httpx-threads``: one ``httpx.Client`` shared by C threads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import payload
from tests.bench.harness import CHILDREN, PYTHON
from tests.bench.sinks import start_nginx

ENGINES = (
    "dispatcher",
    "pycurl-asyncio",
    "aiohttp",
    "aiohttp-uvloop",
    "httpx-async",
    "httpx-threads",
)
WARM_UP = 1_000
HEADERS = payload.http_headers("bench-http-engines")


# ----------------------------------------------------------------- the engines (child side)


def _dispatcher(url: str, total: int, concurrency: int) -> None:
    from dispatcher.http.client import HttpClient, Reading, request_headers
    from dispatcher.http.endpoint import Endpoint
    from dispatcher.loop import Loop

    loop = Loop()
    client = HttpClient(loop, concurrency)
    endpoint, headers, reading = Endpoint(url), request_headers(HEADERS), Reading(4096, 1 << 20)

    async def worker(count: list[int]) -> None:
        while count[0] > 0:
            count[0] -= 1
            response = await client.post(endpoint, headers, payload.BODY, 10.0, reading)
            assert response.status == 202, response.error

    async def run(n: int) -> None:
        count = [n]
        tasks = [loop.spawn(worker(count)) for _ in range(concurrency)]
        for task in tasks:
            await task.finished

    loop.run_until_complete(run(WARM_UP))
    _measured(lambda: loop.run_until_complete(run(total)), total)


def _asyncio_engine(name: str, url: str, total: int, concurrency: int) -> None:
    import asyncio

    if name == "aiohttp-uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())

    async def main() -> None:
        post, close = await _async_client(name, url, concurrency)

        async def run(n: int) -> None:
            count = [n]

            async def worker() -> None:
                while count[0] > 0:
                    count[0] -= 1
                    await post()

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await run(WARM_UP)
        started = time.process_time(), time.perf_counter()
        await run(total)
        _report(started, total)
        await close()

    asyncio.run(main())


async def _async_client(
    name: str, url: str, concurrency: int
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    if name.startswith("aiohttp"):
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

        async def post() -> None:
            async with session.post(url, data=payload.BODY, headers=HEADERS) as response:
                await response.read()
                assert response.status == 202

        return post, session.close
    if name == "httpx-async":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        client = httpx.AsyncClient(limits=limits)

        async def post_httpx() -> None:
            response = await client.post(url, content=payload.BODY, headers=HEADERS)
            assert response.status_code == 202

        return post_httpx, client.aclose
    return await _pycurl_asyncio(url, concurrency)


async def _pycurl_asyncio(
    url: str, concurrency: int
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """libcurl's multi interface on asyncio, the way tornado's curl client drives it."""
    import asyncio

    import pycurl

    from dispatcher.http.client import request_headers

    loop = asyncio.get_running_loop()
    multi = pycurl.CurlMulti()
    multi.setopt(pycurl.M_MAXCONNECTS, concurrency)
    waiting: dict[int, asyncio.Future[int]] = {}
    idle: list[pycurl.Curl] = []
    timer: list[asyncio.TimerHandle | None] = [None]
    headers = request_headers(HEADERS)

    def collect() -> None:
        while True:
            queued, ok, failed = multi.info_read()
            for curl in ok:
                multi.remove_handle(curl)
                idle.append(curl)
                waiting.pop(id(curl)).set_result(curl.getinfo(pycurl.RESPONSE_CODE))
            for curl, _code, _message in failed:
                multi.remove_handle(curl)
                idle.append(curl)
                waiting.pop(id(curl)).set_result(-1)
            if not queued:
                return

    def act(fd: int, flags: int) -> None:
        multi.socket_action(fd, flags)
        collect()

    def on_socket(what: int, fd: int, _multi: object, _data: object) -> None:
        loop.remove_reader(fd)
        loop.remove_writer(fd)
        if what & pycurl.POLL_IN:
            loop.add_reader(fd, act, fd, pycurl.CSELECT_IN)
        if what & pycurl.POLL_OUT:
            loop.add_writer(fd, act, fd, pycurl.CSELECT_OUT)

    def on_timer(ms: int) -> None:
        if timer[0] is not None:
            timer[0].cancel()
        timer[0] = loop.call_later(ms / 1000, act, pycurl.SOCKET_TIMEOUT, 0) if ms >= 0 else None

    multi.setopt(pycurl.M_SOCKETFUNCTION, on_socket)
    multi.setopt(pycurl.M_TIMERFUNCTION, on_timer)

    async def post() -> None:
        curl = idle.pop() if idle else pycurl.Curl()
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.POSTFIELDS, payload.BODY)
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.WRITEFUNCTION, len)
        future: asyncio.Future[int] = loop.create_future()
        waiting[id(curl)] = future
        multi.add_handle(curl)
        assert await future == 202

    async def close() -> None:
        multi.close()

    return post, close


def _httpx_threads(url: str, total: int, concurrency: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.Client(limits=limits)
    lock = threading.Lock()

    def run(n: int) -> None:
        count = [n]

        def worker() -> None:
            while True:
                with lock:
                    if count[0] <= 0:
                        return
                    count[0] -= 1
                response = client.post(url, content=payload.BODY, headers=HEADERS)
                assert response.status_code == 202

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    run(WARM_UP)
    _measured(lambda: run(total), total)


def _measured(run: Callable[[], object], total: int) -> None:
    started = time.process_time(), time.perf_counter()
    run()
    _report(started, total)


def _report(started: tuple[float, float], total: int) -> None:
    cpu, wall = time.process_time() - started[0], time.perf_counter() - started[1]
    print(json.dumps({"cpu_us": cpu / total * 1e6, "rps": total / wall}))


def child(engine: str, url: str, total: int, concurrency: int) -> None:
    if engine == "dispatcher":
        _dispatcher(url, total, concurrency)
    elif engine == "httpx-threads":
        _httpx_threads(url, total, concurrency)
    else:
        _asyncio_engine(engine, url, total, concurrency)


# ----------------------------------------------------------------- the parent


def available(engine: str) -> bool:
    module = {"aiohttp": "aiohttp", "aiohttp-uvloop": "uvloop", "httpx-async": "httpx"}.get(
        engine, "httpx" if engine == "httpx-threads" else "pycurl"
    )
    try:
        __import__(module)
    except ImportError:
        return False
    return engine != "aiohttp-uvloop" or available("aiohttp")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.requests, args.concurrency)
        return 0
    engines = [e for e in ENGINES if available(e)]
    results: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
    with tempfile.TemporaryDirectory(prefix="http-engines-") as work:
        sink = start_nginx(Path(work))
        try:
            for _ in range(args.repeat):
                for engine in engines:
                    argv = [PYTHON, __file__, "--child", engine, "--url", sink.url]
                    argv += ["--requests", str(args.requests)]
                    argv += ["--concurrency", str(args.concurrency)]
                    done = subprocess.run(argv, capture_output=True, text=True, check=False)
                    if done.returncode != 0:
                        print(f"{engine} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                        return 1
                    results[engine].append(json.loads(done.stdout.splitlines()[-1]))
        finally:
            sink.stop()
            CHILDREN.kill_all()
    print(
        f"{args.requests:,} POSTs of 1 KB to nginx (202), {args.concurrency} in flight, "
        f"median of {args.repeat}:\n"
    )
    print("| engine | CPU us / request | req/s |")
    print("|---|---|---|")
    for engine, runs in results.items():
        cpu = statistics.median(r["cpu_us"] for r in runs)
        rps = statistics.median(r["rps"] for r in runs)
        print(f"| {engine} | {cpu:.0f} | {rps:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
