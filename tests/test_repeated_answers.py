"""A platform (or a proxy in front of it) that sends every answer again ~50 ms later on the
same connection: HTTP/1.1 answers carry no request id, so a client reading the repeat as the
next request's answer takes every later answer for the request before it (a finalize never
sent taken as done, a refused batch taken as accepted). `evalpush push` runs as a real
subprocess through a repeating relay in front of the local platform."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from evalpush.local_platform import LocalPlatform
from pushing import assert_exactly_once, push_environ, push_until_done
from support.commands import evalpush, status_json
from support.runs import trace_line, write_run

REPEAT_AFTER_SECONDS = 0.05
JOIN_SECONDS = 5.0


class RepeatingRelay:
    """A TCP relay on loopback in front of `upstream`: what the platform sends comes to the
    client, and again `REPEAT_AFTER_SECONDS` later on the same connection, or sooner: as soon
    as the next request on the connection arrives, which then goes on to the platform
    `REPEAT_AFTER_SECONDS` later, if the client is still there (the repeat comes after that
    request went out and before its answer, whatever the timing)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self.answers = 0
        self.repeated = 0  # repeats sent on a connection still open
        self._threads = [threading.Thread(target=self._accept, name="repeating-relay")]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._done.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            connection = _Relayed(self, client, socket.create_connection(self._upstream))
            for target in (connection.requests, connection.answers):
                thread = threading.Thread(target=target, daemon=True)
                self._threads.append(thread)
                thread.start()

    def counted(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def close(self) -> None:
        self._done.set()
        self._threads[0].join(JOIN_SECONDS)
        self._listener.close()


class _Relayed:
    """One client connection through the relay, and its own connection to the platform."""

    def __init__(self, relay: RepeatingRelay, client: socket.socket, upstream: socket.socket):
        self._relay = relay
        self._client = client
        self._upstream = upstream
        self._lock = threading.Lock()
        self._unrepeated: list[bytes] = []  # answers not sent again yet

    def _repeat(self, data: bytes) -> None:
        with self._lock:
            if data not in self._unrepeated:
                return  # sent again already
            self._unrepeated.remove(data)
            with contextlib.suppress(OSError):
                self._client.sendall(data)
                self._relay.counted("repeated")

    def requests(self) -> None:
        with contextlib.suppress(OSError):
            while data := self._client.recv(65536):
                if self._unrepeated:
                    for answer in list(self._unrepeated):
                        self._repeat(answer)
                    # The request goes on a little later, and not at all once the client hung
                    # up (as a proxy drops a request whose client went away).
                    time.sleep(REPEAT_AFTER_SECONDS)
                    if self._client_gone():
                        return
                self._upstream.sendall(data)
        with contextlib.suppress(OSError):
            self._upstream.shutdown(socket.SHUT_WR)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self._client], [], [], 0)
        return bool(readable) and self._client.recv(1, socket.MSG_PEEK) == b""

    def answers(self) -> None:
        with contextlib.suppress(OSError):
            while data := self._upstream.recv(65536):
                with self._lock:
                    self._client.sendall(data)
                    self._unrepeated.append(data)
                self._relay.counted("answers")
                threading.Timer(REPEAT_AFTER_SECONDS, self._repeat, args=(data,)).start()
        with contextlib.suppress(OSError):
            self._client.shutdown(socket.SHUT_WR)


@pytest.fixture
def relay(platform: LocalPlatform) -> Iterator[RepeatingRelay]:
    host, port = platform.base_url.removeprefix("http://").rsplit(":", 1)
    made = RepeatingRelay((host, int(port)))
    yield made
    made.close()


def test_every_answer_repeated_late_leaves_ledger_and_platform_agreeing(
    platform: LocalPlatform, relay: RepeatingRelay, tmp_path: Path
) -> None:
    """Create, each of 5 batches and the finalize are each answered twice (the repeat reaching
    the client if its connection is still open): every sample is stored once, the evaluation
    finalized once, and the ledger says what the platform holds."""
    root = tmp_path / "outputs"
    write_run(root, lines=[trace_line(i, i // 2) for i in range(15)])
    environ = push_environ(
        platform,
        tmp_path,
        PRIME_API_BASE_URL=relay.url,
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="3",
    )
    push_until_done(root, environ)

    assert relay.answers >= 7  # create, 5 batches, finalize (and the reads)
    assert relay.repeated >= 1  # on the connections the client kept
    assert_exactly_once(platform, root)
    run: Callable[..., Any] = lambda *args: evalpush(environ, *args)  # noqa: E731
    (row,) = status_json(run)
    assert row["state"] == "finalized", row
