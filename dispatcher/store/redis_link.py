"""One connection to the dedupe store, driven by the engine's loop: bytes out, replies in.

Why not redis-py's client on a thread of its own, as before: at W1's rate that
thread cost as much CPU per event as the rest of the store's work together
(the interpreter lock passed to it and back for every round trip, the
pipeline's Python, a wake-up of the loop through its inbox). Here the loop
writes a batch's commands on a non-blocking socket and reads the replies when
the socket is readable, like every other connection it holds.

Nothing of the protocol is written here. redis-py opens the connection
(``open_connection``: the URL and its options, TLS, AUTH, SELECT; on a thread,
since a name lookup may block); hiredis, Redis's own C library, packs the
commands and reads the replies from whatever bytes have arrived. The socket is
redis-py's (``Connection._sock``, not public API: the tests of the store run
against the redis-py the project pins).

RESP2 is asked for whatever the URL says: a RESP3 connection may carry push
messages nobody asked for, which would be taken for a command's reply.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import Any, Final

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatcher.loop import FAILED, READABLE, WRITABLE, Loop

_READ_SIZE: Final = 65_536

Reply = Any  # what hiredis reads: int, bytes, list, None, or a hiredis.ReplyError


def open_connection(url: str, timeout: float) -> Any:
    """A connected redis-py connection (blocking: call it off the loop). Raises
    ``redis.RedisError`` or ``OSError`` for what fails."""
    pool = redis.ConnectionPool.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),  # the timeout is the bound: no silent second try
        health_check_interval=0,
    )
    pool.connection_kwargs["protocol"] = 2
    connection = pool.make_connection()
    connection.connect()  # type: ignore[no-untyped-call]
    return connection


class RedisLink:
    """A connected connection handed to the loop: ``send`` commands, replies to
    ``on_reply`` in order, and ``on_lost`` once if the connection fails."""

    def __init__(
        self,
        loop: Loop,
        connection: Any,
        on_reply: Callable[[Reply], None],
        on_lost: Callable[[Exception], None],
    ) -> None:
        self._loop = loop
        self._connection = connection
        self._sock: socket.socket = connection._sock
        self._sock.setblocking(False)
        self._tls = isinstance(self._sock, ssl.SSLSocket)
        self._fd = self._sock.fileno()
        self._reader = hiredis.Reader()
        self._out = bytearray()
        self._on_reply = on_reply
        self._on_lost = on_lost
        self._open = True
        self._mask = READABLE
        loop.watch(self._fd, READABLE, self._ready)

    def send(self, commands: list[tuple[Any, ...]]) -> None:
        """Queue ``commands`` and write what the socket takes now."""
        # hiredis's packer, in C: redis-py's (``pack_commands``) encodes each
        # argument in Python, a fifth of the store's cost per event at W1.
        self._out += b"".join([hiredis.pack_command(command) for command in commands])
        self._write()

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._loop.unwatch(self._fd)
        self._connection.disconnect()

    def _ready(self, _fd: int, mask: int) -> None:
        if mask & WRITABLE and self._out:
            self._write()
        if self._open and mask & (READABLE | FAILED):
            self._read()

    def _write(self) -> None:
        try:
            while self._out:
                sent = self._sock.send(self._out)
                del self._out[:sent]
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            pass  # the rest when the socket takes it
        except OSError as e:
            self._lose(e)
            return
        self._watch(READABLE | WRITABLE if self._out else READABLE)

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(_READ_SIZE)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError as e:
                self._lose(e)
                return
            if not data:
                self._lose(ConnectionError("the store closed the connection"))
                return
            self._reader.feed(data)
            # TLS may hold decrypted bytes the socket will not signal again.
            if len(data) < _READ_SIZE and not (self._tls and self._sock.pending()):  # type: ignore[attr-defined]
                break
        try:
            while (reply := self._reader.gets()) is not False:
                self._on_reply(reply)
                if not self._open:
                    return  # a reply ended the link (an error the caller acts on)
        except hiredis.ProtocolError as e:
            self._lose(ConnectionError(f"unreadable reply from the store: {e}"))

    def _watch(self, mask: int) -> None:
        if self._open and mask != self._mask:
            self._mask = mask
            self._loop.watch(self._fd, mask, self._ready)

    def _lose(self, error: Exception) -> None:
        if self._open:
            self.close()
            self._on_lost(error)
