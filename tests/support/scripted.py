"""Scripted HTTP servers on loopback: each reads requests off a real socket and answers with
exactly the bytes a test gives it (framings the local platform does not use, answers that are
not HTTP, a proxy), so what the platform client makes of them is seen byte for byte."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

JOIN_SECONDS = 5.0

Script = Callable[["Exchange"], None]
"""What the server does on one connection."""


class Exchange:
    """One accepted connection, seen from the server: read a request, write bytes."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buffer = b""

    def request(self) -> bytes:
        """The next request's head and its Content-Length body (b"" once the client closed)."""
        while b"\r\n\r\n" not in self._buffer:
            data = self.conn.recv(65536)
            if not data:
                return b""
            self._buffer += data
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(self._buffer) < length:
            self._buffer += self.conn.recv(65536)
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return head + b"\r\n\r\n" + body

    def send(self, data: bytes) -> None:
        self.conn.sendall(data)


class Server:
    """A loopback listener; connection number n (from 0) is handled by `scripts[n]`, the last
    script serving every later one. `requests` holds every request head read, in order."""

    def __init__(self, *scripts: Script) -> None:
        self._scripts = scripts
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.connections = 0
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="scripted-server")
        self._accepting.start()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            script = self._scripts[min(self.connections, len(self._scripts) - 1)]
            self.connections += 1
            thread = threading.Thread(target=self._handle, args=(conn, script), daemon=True)
            self._threads.append(thread)
            thread.start()

    @staticmethod
    def _handle(conn: socket.socket, script: Script) -> None:
        conn.settimeout(JOIN_SECONDS)
        with conn:
            try:
                script(Exchange(conn))
            except OSError:
                pass  # the client went away: what it made of it is the test's to check

    def close(self) -> None:
        self._done.set()
        self._accepting.join(JOIN_SECONDS)
        for thread in self._threads:
            thread.join(JOIN_SECONDS)
        self._listener.close()


def answering(*answers: bytes) -> Script:
    """Read a request, send the next answer, for each answer in turn; then wait for the close."""

    def script(exchange: Exchange) -> None:
        for answer in answers:
            if not exchange.request():
                return
            exchange.send(answer)
        exchange.request()

    return script


def once(answer: bytes) -> Script:
    """Read a request, send `answer`, hang up (without saying so in the answer)."""

    def script(exchange: Exchange) -> None:
        exchange.request()
        exchange.send(answer)

    return script


def ok(body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def recording(seen: list[bytes], answer: bytes) -> Script:
    """Note each request whole, answer `answer`."""

    def script(exchange: Exchange) -> None:
        seen.append(exchange.request())
        exchange.send(answer)

    return script
