"""A TCP proxy on 127.0.0.1 in front of a real server (the test sshd), for network faults.

- `cut()` resets every open connection at once (what a dead router or a killed VPN does:
  the client hears of it at once); new connections pass;
- `blackhole()` silences every open connection: its sockets stay open and its bytes are
  dropped, in both directions, for good, and nobody is told (a NAT table flushed, a laptop
  roaming to another network, a host that vanished). A client that waits on such a
  connection without a timeout waits forever. New connections pass.

One thread per direction and connection copies the bytes; `connections` counts the
connections accepted so far.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.silent = False
        self.closed = False


class TcpProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self.connections += 1
                self._pairs.append(pair)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(pair, a, b), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                if not pair.silent:
                    self._close(pair)
                return
            if pair.silent:
                continue  # dropped: the other side never hears of it
            try:
                dst.sendall(data)
            except OSError:
                self._close(pair)
                return

    def _close(self, pair: _Pair, *, reset: bool = False) -> None:
        if pair.closed:
            return
        pair.closed = True
        for s in (pair.client, pair.server):
            if reset:
                with contextlib.suppress(OSError):  # linger 0: close sends RST
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _open(self) -> list[_Pair]:
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]
            return [p for p in self._pairs if not p.silent]

    def cut(self) -> int:
        """Reset every open connection; return how many."""
        pairs = self._open()
        for pair in pairs:
            self._close(pair, reset=True)
        return len(pairs)

    def blackhole(self) -> int:
        """Silence every open connection for good (held open, bytes dropped); return how many."""
        pairs = self._open()
        for pair in pairs:
            pair.silent = True
        return len(pairs)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            self._close(pair)
