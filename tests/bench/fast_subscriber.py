"""A cheap, fast HTTP subscriber for benchmarks: answers 202 at once, counts ce-ids.

asyncio with a hand-rolled HTTP/1.1 parser (keep-alive, Content-Length bodies):
it must not be the bottleneck it is measuring against. ``GET /stats`` returns
``received duplicates``.
"""

from __future__ import annotations

import asyncio
import sys

RESPONSE = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"


class Stats:
    def __init__(self) -> None:
        self.ids: set[bytes] = set()
        self.received = 0
        self.duplicates = 0


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stats: Stats) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            event_id = b""
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                lowered = name.strip().lower()
                if lowered == b"content-length":
                    length = int(value)
                elif lowered == b"ce-id":
                    event_id = value.strip()
            if length:
                await reader.readexactly(length)
            if head.startswith(b"GET /stats"):
                body = f"{stats.received} {stats.duplicates}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                continue
            stats.received += 1
            if event_id in stats.ids:
                stats.duplicates += 1
            stats.ids.add(event_id)
            writer.write(RESPONSE)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    stats = Stats()
    server = await asyncio.start_server(lambda r, w: handle(r, w, stats), "127.0.0.1", port)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
