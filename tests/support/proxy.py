"""A TCP proxy between the service and a broker that can cut or black-hole the path.

``blackhole()`` keeps every socket open but stops forwarding bytes, as a
firewall that forgot the flow does: no FIN, no RST, just silence.
``restore()`` lets new connections through again (black-holed ones stay dead,
as they would behind such a firewall). ``reset_all()`` closes every proxied
connection at once. ``hold()`` keeps what the client sends from the server,
without losing it, until ``release()`` (``held_bytes`` says whether anything
came meanwhile): a request that reaches its server late, in a known order.
``drop_confirms=True`` passes every frame but the broker's ``basic.ack``: a
broker that stays up and never confirms, as a quorum queue without a majority
does; ``pass_confirms()`` lets them through again (for connections made after,
and for those already open).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading


class FaultProxy:
    def __init__(self, target_port: int, drop_confirms: bool = False) -> None:
        self._target = ("127.0.0.1", target_port)
        self._drop_confirms = drop_confirms
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._holes: set[int] = set()  # ids of black-holed pairs
        self._blackhole = False
        self._held: list[tuple[socket.socket, bytes]] | None = None  # (upstream, data) in order
        self.held_bytes = 0
        self._closed = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def blackhole(self) -> None:
        with self._lock:
            self._blackhole = True
            self._holes = {id(pair) for pair in self._pairs}

    def restore(self) -> None:
        with self._lock:
            self._blackhole = False

    def pass_confirms(self) -> None:
        self._drop_confirms = False

    def hold(self) -> None:
        with self._lock:
            self._held = []
            self.held_bytes = 0

    def release(self) -> None:
        """Send what was held, in order, and pass everything through again."""
        with self._lock:
            held, self._held = self._held or [], None
            for upstream, data in held:
                with contextlib.suppress(OSError):
                    upstream.sendall(data)

    def reset_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream, done in pairs:
            done.set()
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                    sock.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            # close() alone leaves a thread blocked in accept() accepting.
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.reset_all()

    def open_connections(self) -> int:
        with self._lock:
            return sum(1 for _c, _u, done in self._pairs if not done.is_set())

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._blackhole:
                    # A SYN into the void: keep the socket, never answer.
                    self._pairs.append((client, client, threading.Event()))
                    continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            done = threading.Event()
            pair = (client, upstream, done)
            with self._lock:
                self._pairs.append(pair)
                self.accepted += 1
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair: tuple[socket.socket, socket.socket, threading.Event]) -> None:
        client, upstream, done = pair
        peers = {client: upstream, upstream: client}
        downstream = b""  # the broker's bytes not yet a whole frame (drop_confirms)
        try:
            while not done.is_set() and peers:
                readable, _, _ = select.select(list(peers), [], [], 0.2)
                with self._lock:
                    silent = id(pair) in self._holes
                for sock in readable:
                    data = sock.recv(65536)
                    if data and sock is client and self._keep_held(upstream, data):
                        continue
                    if data and sock is upstream and (self._drop_confirms or downstream):
                        data, downstream = self._confirms_dropped(downstream + data)
                        if not data:
                            continue
                    if data and not silent:
                        peers[sock].sendall(data)
                    elif not data and not silent:
                        return
                    elif not data:
                        # Black-holed: the far side gave up, but the near side
                        # must see nothing at all, not even a FIN.
                        del peers[sock]
        except OSError:
            return
        finally:
            if not (id(pair) in self._holes and not done.is_set()):
                done.set()
                for sock in (client, upstream):
                    with contextlib.suppress(OSError):
                        sock.close()

    def _confirms_dropped(self, stream: bytes) -> tuple[bytes, bytes]:
        """What of the broker's ``stream`` to pass on now, and what to keep for later."""
        if self._drop_confirms:
            return _without_acks(stream)
        return stream, b""  # confirms pass again: what was cut mid-frame goes first

    def _keep_held(self, upstream: socket.socket, data: bytes) -> bool:
        with self._lock:
            if self._held is None:
                return False
            self._held.append((upstream, data))
            self.held_bytes += len(data)
            return True


_BASIC_ACK = (60, 80)  # AMQP 0-9-1 class and method ids


def _without_acks(stream: bytes) -> tuple[bytes, bytes]:
    """The whole frames of ``stream`` but basic.ack ones, and the incomplete rest."""
    kept, position = [], 0
    while len(stream) - position >= 7:
        kind, _channel, size = struct.unpack_from(">BHI", stream, position)
        end = position + 8 + size  # header, payload, frame-end octet
        if end > len(stream):
            break
        if not (kind == 1 and struct.unpack_from(">HH", stream, position + 7) == _BASIC_ACK):
            kept.append(stream[position:end])
        position = end
    return b"".join(kept), stream[position:]
