"""sd_notify: what arrives on a real AF_UNIX datagram socket bound as $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evalpush.service import MAX_STATUS_CHARS, Notifier

RECEIVE_TIMEOUT_SECONDS = 10.0


class Listener:
    """A datagram socket standing in for systemd's notify socket."""

    def __init__(self, address: str) -> None:
        self.address = address  # as $NOTIFY_SOCKET spells it
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(RECEIVE_TIMEOUT_SECONDS)

    def receive(self) -> str:
        return self.sock.recv(65536).decode("utf-8")

    def nothing_waiting(self) -> bool:
        self.sock.setblocking(False)
        try:
            self.sock.recv(65536)
        except BlockingIOError:
            return True
        finally:
            self.sock.settimeout(RECEIVE_TIMEOUT_SECONDS)
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (AF_UNIX paths stop at 107 bytes; tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


@pytest.fixture(params=["path", "abstract"])
def listener(request, short_dir) -> Iterator[Listener]:
    address = (
        str(short_dir / "notify") if request.param == "path" else f"@evalpush-test-{uuid.uuid4()}"
    )
    bound = Listener(address)
    yield bound
    bound.close()


@pytest.fixture
def notifier(listener) -> Iterator[Notifier]:
    with Notifier.from_environ({"NOTIFY_SOCKET": listener.address}) as made:
        yield made


class TestMessages:
    def test_each_message_arrives_as_one_datagram(self, notifier, listener):
        sent = [
            notifier.ready(),
            notifier.status("3 uploading, 12 waiting, 10,402 finalized, platform reachable"),
            notifier.watchdog(),
            notifier.stopping(),
        ]

        received = [listener.receive() for _ in range(4)]

        assert sent == [True] * 4
        assert received == [
            "READY=1",
            "STATUS=3 uploading, 12 waiting, 10,402 finalized, platform reachable",
            "WATCHDOG=1",
            "STOPPING=1",
        ]

    def test_reloading_carries_the_monotonic_clock_in_microseconds(self, notifier, listener):
        before = time.monotonic_ns() // 1000
        notifier.reloading()
        after = time.monotonic_ns() // 1000

        first, second = listener.receive().split("\n")

        assert first == "RELOADING=1"
        assert second.startswith("MONOTONIC_USEC=")
        assert before <= int(second.removeprefix("MONOTONIC_USEC=")) <= after

    def test_a_status_is_always_one_line_of_bounded_length(self, notifier, listener):
        notifier.status("line one\nline two\r\n\tthree")
        notifier.status("x" * 10_000)

        assert listener.receive() == "STATUS=line one line two three"
        long = listener.receive()
        assert len(long) == len("STATUS=") + MAX_STATUS_CHARS and long.endswith("…")

    def test_a_status_naming_a_path_that_is_not_utf8_is_sent_escaped(self, notifier, listener):
        notifier.status("waiting: /data/" + os.fsdecode(b"caf\xe9"))

        assert listener.receive() == "STATUS=waiting: /data/caf\\udce9"


class TestWatchdog:
    @pytest.mark.parametrize(
        "environ, seconds",
        [
            ({"WATCHDOG_USEC": "60000000"}, 30.0),
            ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4242"}, 30.0),
            ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
            ({}, None),
            ({"WATCHDOG_USEC": "soon"}, None),
            ({"WATCHDOG_USEC": "0"}, None),
        ],
        ids=["half of WATCHDOG_USEC", "for this pid", "for another pid", "off", "garbled", "zero"],
    )
    def test_the_ping_interval_is_half_the_watchdog_timeout_when_it_is_ours(
        self, short_dir, environ, seconds
    ):
        environ = {"NOTIFY_SOCKET": str(short_dir / "notify"), **environ}

        assert Notifier.from_environ(environ, pid=4242).watchdog_seconds == seconds

    def test_pings_are_sent_when_due_by_the_callers_clock(self, listener):
        environ = {"NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "20000000"}
        with Notifier.from_environ(environ) as notifier:
            due = [notifier.ping_if_due(now) for now in (100.0, 105.0, 109.9, 110.0, 115.0, 120.0)]

        assert due == [True, False, False, True, False, True]
        assert [listener.receive() for _ in range(3)] == ["WATCHDOG=1"] * 3
        assert listener.nothing_waiting()

    def test_without_a_watchdog_nothing_is_pinged(self, notifier, listener):
        assert notifier.ping_if_due(0.0) is False
        assert listener.nothing_waiting()


class TestWithoutSystemd:
    def test_without_notify_socket_every_message_is_a_no_op(self):
        notifier = Notifier.from_environ({"WATCHDOG_USEC": "1000000"})

        sent = [notifier.ready(), notifier.status("x"), notifier.watchdog(), notifier.stopping()]

        assert (notifier.enabled, notifier.watchdog_seconds, sent) == (False, None, [False] * 4)
        assert notifier.ping_if_due(0.0) is False

    def test_an_address_that_is_neither_a_path_nor_abstract_is_refused_once(self):
        with capture_logs() as logs:
            notifier = Notifier.from_environ({"NOTIFY_SOCKET": "vsock:2:1234"})
            notifier.ready()

        assert notifier.enabled is False
        assert [e["event"] for e in logs] == [
            "NOTIFY_SOCKET is not a path or @name; not notifying systemd"
        ]


class TestFailures:
    def test_a_socket_nobody_listens_on_is_logged_once_and_never_raises(self, short_dir):
        address = str(short_dir / "notify")
        with capture_logs() as logs, Notifier.from_environ({"NOTIFY_SOCKET": address}) as notifier:
            sent = [notifier.ready(), notifier.status("a"), notifier.watchdog()]

        assert sent == [False, False, False]
        assert [(e["event"], e["socket"]) for e in logs] == [
            ("cannot notify systemd; going on without it", address)
        ]

    def test_sending_resumes_when_the_socket_comes_back_and_a_new_failure_is_logged_again(
        self, short_dir
    ):
        address = str(short_dir / "notify")
        with capture_logs() as logs, Notifier.from_environ({"NOTIFY_SOCKET": address}) as notifier:
            notifier.ready()  # nobody there
            listener = Listener(address)
            back = notifier.status("back")
            received = listener.receive()
            listener.close()
            os.unlink(address)
            gone_again = notifier.status("gone")

        assert (back, received, gone_again) == (True, "STATUS=back", False)
        assert [e["event"] for e in logs] == [
            "cannot notify systemd; going on without it",
            "notifying systemd again",
            "cannot notify systemd; going on without it",
        ]


def test_a_real_process_notifies_the_socket_named_in_its_environment(listener):
    code = (
        "from evalpush.service.sdnotify import Notifier\n"
        "n = Notifier.from_environ()\n"
        "n.ready(); n.status('12 waiting'); n.ping_if_due(0.0); n.stopping()\n"
    )
    env = {**os.environ, "NOTIFY_SOCKET": listener.address, "WATCHDOG_USEC": "2000000"}
    env.pop("WATCHDOG_PID", None)  # a pid the test runner itself may have been given

    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)

    assert [listener.receive() for _ in range(4)] == [
        "READY=1",
        "STATUS=12 waiting",
        "WATCHDOG=1",
        "STOPPING=1",
    ]


def test_a_listener_that_stops_reading_never_blocks_the_daemon(tmp_path: Path) -> None:
    """A notify socket whose queue is full (systemd wedged, or a test that stopped reading)
    costs dropped messages, not a daemon stuck in sendto."""
    address = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    notifier = Notifier(address)
    try:
        started = time.monotonic()
        sent = [notifier.status(f"line {n}") for n in range(5_000)]
        assert time.monotonic() - started < 10.0
        assert any(sent) and not all(sent), "the queue filled, later messages were dropped"
    finally:
        notifier.close()
        listener.close()
