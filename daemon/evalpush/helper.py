"""Helper processes of a `push` of many runs.

Python runs one thread at a time in a process: however many upload threads a push has, their
work (requests, ledger writes, conversion) is done on one CPU at a time, and a push of
thousands of small runs was bound by it. So a push of at least `HELPER_MIN_RUNS` runs, on a
machine where it may use more than one CPU, starts `upload.push_processes - 1` helper processes
(`python -m evalpush.helper`) and gives them part of its upload threads: the runs at once stay
`upload.max_concurrent_runs` in all.

A helper is the push's hands, not a second push: the parent finds the runs, hands each to an
upload thread, hears what became of it (progress, then the result) and decides what it means,
as for a run it uploaded itself. A thread of the parent given to a helper (a `Lane`) sends the
run's directory down a pipe of its own and waits on another for the answer; the helper's thread
at the far end uploads it with `evalpush.push.push_one`, under the run's claim in the shared
ledger like any process. What keeps every run exactly once is that claim, so nothing here is
trusted with it:
- the helper stops when its parent does: the parent closes its control pipe (stdin) when it is
  asked to stop, and the kernel closes it when the parent dies; SIGINT is ignored (a Ctrl-C
  reaches the whole process group, and the parent decides); a helper that has not answered
  its runs `EXIT_SECONDS` after the stop is killed, as if it had died;
- a helper that dies, answers what is not the protocol, or stops while its parent does not
  (a SIGTERM of the helper alone), is killed and waited for, and the run it had (and every
  later run of its lanes) is uploaded by the parent itself, which takes over the dead
  helper's claim and reconciles with the platform like after any crash.

Frames on the pipes: a 4-byte big-endian length, then msgpack (msgspec).
"""

from __future__ import annotations

import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec

from evalpush.errors import AuthError, Busy, EvalpushError, LedgerError
from evalpush.ledger import RunRecord
from evalpush.log import get_logger

if TYPE_CHECKING:
    from evalpush.app import App
    from evalpush.config import Config
    from evalpush.push import PushResult

HELPER_MIN_RUNS = 64
"""A push of fewer runs keeps them in one process: a helper's start (~0.15 s of CPU) is worth it
only past a few hundred milliseconds of upload work (a one-trace run costs ~4 ms)."""
MAX_FRAME_BYTES = 64 * 1024 * 1024
STOP_POLL_SECONDS = 0.05
"""How soon a stop of the parent (a signal, `--timeout`, a refused key) reaches its helpers."""
EXIT_SECONDS = 10.0
"""How long a helper has to end once its work is done, or to answer its runs once it was told to
stop, before a kill."""

_FRAME = struct.Struct("!I")


class _Request(msgspec.Struct, array_like=True):
    path: bytes  # the directory as the kernel knows it (`os.fsencode`)
    waited_for: int | None


# Text that may name a path whose bytes are not UTF-8 (a lone surrogate each, which msgpack
# cannot carry) goes as its bytes (`_wire`), and is read back as the same text (`_text`).


def _wire(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class _Busy(msgspec.Struct, array_like=True):
    message: bytes
    pid: int
    host: str
    since: float


class _Progress(msgspec.Struct, tag=True, array_like=True):
    record: RunRecord


class _Result(msgspec.Struct, tag=True, array_like=True):
    record: RunRecord | None
    set_aside: int
    error: bytes | None
    already: bool
    busy: _Busy | None
    uploaded_by: int | None
    copy_of: bytes | None
    refused: bytes | None  # the platform refused the key: the whole push stops
    stopped: bool  # the helper was stopping as it answered


class _Failure(msgspec.Struct, tag=True, array_like=True):
    """The push cannot go on (the ledger cannot be written): raised again in the parent."""

    kind: str
    message: bytes


_Reply = _Progress | _Result | _Failure
_ENCODER = msgspec.msgpack.Encoder()
_REQUEST = msgspec.msgpack.Decoder(_Request)
_REPLY = msgspec.msgpack.Decoder(_Reply)


class HelperGone(Exception):
    """A helper died, or answered what is not the protocol: its runs go on in the parent."""


def _write_frame(out: IO[bytes], message: msgspec.Struct) -> None:
    data = _ENCODER.encode(message)
    out.write(_FRAME.pack(len(data)) + data)
    out.flush()


def _read_frame(source: IO[bytes]) -> bytes | None:
    """The next frame's bytes; None at the end of the pipe between frames."""
    head = source.read(_FRAME.size)
    if not head:
        return None
    if len(head) < _FRAME.size:
        raise EOFError("the pipe ended inside a frame")
    (size,) = _FRAME.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {size} bytes")
    data = source.read(size)
    if len(data) < size:
        raise EOFError("the pipe ended inside a frame")
    return data


# ------------------------------------------------------------ the parent's side


def helper_count(config: Config, runs: int, workers: int) -> int:
    """How many helper processes a push of `runs` runs on `workers` upload threads starts."""
    if runs < HELPER_MIN_RUNS:
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min(config.upload.push_processes, cpus or 1, workers) - 1)


class Lane:
    """One upload thread's way to a helper: a pipe for the runs, one for what became of them."""

    def __init__(self, helper: Helper, requests: IO[bytes], replies: IO[bytes]) -> None:
        self.helper = helper
        self._requests = requests
        self._replies = replies
        self.idle = threading.Event()  # no run of this lane is with the helper
        self.idle.set()

    def push(
        self, directory: Path, waited_for: int | None, on_progress: Callable[[RunRecord], None]
    ) -> tuple[PushResult, AuthError | None]:
        """What the helper made of `directory` (`push_one`'s answer). `HelperGone` if the helper
        is dead or broke the protocol; it is then killed, and the run's outcome is not known."""
        if self.helper.gone:
            raise HelperGone(self.helper.gone)
        self.idle.clear()
        try:
            _write_frame(self._requests, _Request(os.fsencode(directory), waited_for))
            while True:
                data = _read_frame(self._replies)
                if data is None:
                    raise EOFError("the helper closed its end")
                reply = _REPLY.decode(data)
                if not isinstance(reply, _Progress):
                    break
                on_progress(reply.record)
        except (OSError, EOFError, ValueError, msgspec.DecodeError) as exc:
            raise HelperGone(self.helper.lost(exc)) from None
        finally:
            self.idle.set()
        if isinstance(reply, _Result) and reply.stopped and not self.helper.push_stop.is_set():
            # Stopped on its own (a SIGTERM of the helper alone): it would answer every later
            # run "interrupted" at once. Its runs, this one too, go on in the push.
            raise HelperGone(self.helper.lost(RuntimeError("it stopped, the push did not")))
        if isinstance(reply, _Failure):
            error = LedgerError if reply.kind == "LedgerError" else EvalpushError
            raise error(_text(reply.message))
        return _push_result(directory, reply), (
            AuthError(_text(reply.refused)) if reply.refused is not None else None
        )

    def close(self) -> None:
        for pipe in (self._requests, self._replies):
            try:
                pipe.close()
            except OSError:
                pass  # a request not delivered: the helper is gone, which is what closing is for


def _push_result(directory: Path, reply: _Result) -> PushResult:
    from evalpush.push import PushResult

    busy = reply.busy
    held = None
    if busy is not None:
        held = Busy(_text(busy.message), pid=busy.pid, host=busy.host, since=busy.since)
    return PushResult(
        directory,
        reply.record,
        reply.set_aside,
        _text(reply.error) if reply.error is not None else None,
        reply.already,
        busy=held,
        uploaded_by=reply.uploaded_by,
        copy_of=_text(reply.copy_of) if reply.copy_of is not None else None,
    )


class Helper:
    """One helper process, from the parent's side."""

    def __init__(
        self, config: Config, log_level: str, log_format: str, lanes: int, stop: threading.Event
    ) -> None:
        """`stop`: the push's (set when it is asked to stop)."""
        import pickle  # here: a push of few runs starts no helper, and imports neither
        import subprocess

        self.push_stop = stop
        self.gone: str | None = None  # why its lanes are no longer used
        self._lock = threading.Lock()
        # Each lane's pipes: the helper's ends (requests to read, replies to write), closed here
        # once it has them, and ours, in the same order (requests to write, replies to read).
        ours: list[int] = []
        theirs: list[int] = []
        # The helper starts with SIGINT blocked (the mask outlives exec) and ignores it before
        # unblocking it: a Ctrl-C while its Python starts would otherwise end it with a
        # KeyboardInterrupt traceback. This thread only defers it: another thread, or this one
        # once it unblocks, takes it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for _ in range(lanes):
                requests_read, requests_write = os.pipe()
                theirs.append(requests_read)
                ours.append(requests_write)
                replies_read, replies_write = os.pipe()
                theirs.append(replies_write)
                ours.append(replies_read)
            self.process = subprocess.Popen(
                [sys.executable, "-m", "evalpush.helper"]
                + [f"{theirs[i]}:{theirs[i + 1]}" for i in range(0, len(theirs), 2)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,  # stdout is the push's (its --json document)
                pass_fds=theirs,
            )
        except BaseException:  # no helper: our ends are closed too (no descriptor left open)
            for fd in ours:
                os.close(fd)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in theirs:
                os.close(fd)
        self.lanes = [
            Lane(self, open(ours[i], "wb"), open(ours[i + 1], "rb")) for i in range(0, len(ours), 2)
        ]
        assert self.process.stdin is not None
        self._control: IO[bytes] | None = self.process.stdin
        try:
            self._control.write(pickle.dumps((config, log_level, log_format)))
            self._control.flush()
        except OSError as exc:
            self.lost(exc)

    def lost(self, why: BaseException) -> str:
        """The helper broke down: kill it, wait for it (its claims are then a dead process's,
        which the parent takes over), and say why once."""
        with self._lock:
            if self.gone is None:
                self.process.kill()
                code = self.process.wait()
                self.gone = f"helper process {self.process.pid} ended (exit {code}): {why}"
                get_logger().warning(
                    "a helper process ended: its runs go on in this process",
                    pid=self.process.pid,
                    exit=code,
                    error=str(why),
                )
            return self.gone

    def stop(self) -> None:
        """Tell the helper to stop: its uploads in flight end as interrupted, progress kept."""
        with self._lock:
            control, self._control = self._control, None
        if control is not None:
            try:
                control.close()
            except OSError:
                pass  # the helper is gone already

    def answer_by(self, deadline: float) -> None:
        """Wait for the helper, told to stop, to answer the runs it has by `deadline`
        (`time.monotonic`); kill it if it has not (their lanes then end)."""
        for lane in self.lanes:
            if not lane.idle.wait(max(0.0, deadline - time.monotonic())):
                self.lost(TimeoutError(f"a run not answered {EXIT_SECONDS:g} s after the stop"))
                return

    def close(self) -> None:
        """End the helper once its work is done (or stopped), and wait for it."""
        import subprocess

        for lane in self.lanes:
            lane.close()
        self.stop()
        try:
            self.process.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Helpers:
    """The helper processes of one push, and the thread that passes a stop on to them."""

    def __init__(self, app: App, count: int, lanes_each: int, log_level: str) -> None:
        config = app.config
        self._stop = app.stop
        self._closed = threading.Event()
        self._forward: threading.Thread | None = None
        self.helpers: list[Helper] = []
        try:
            for _ in range(count):
                self.helpers.append(
                    Helper(config, log_level, config.log.format, lanes_each, app.stop)
                )
        except OSError as exc:  # no process or pipe to be had: the push goes on without
            get_logger().warning(
                "could not start a helper process: the runs go on in this process",
                error=str(exc),
            )
        except BaseException:
            self.close()
            raise
        if self.helpers:  # nothing to pass a stop on to otherwise (the default: no helper)
            self._forward = threading.Thread(target=self._forward_stop, name="helper-stop")
            self._forward.start()

    @property
    def lanes(self) -> list[Lane]:
        return [lane for helper in self.helpers for lane in helper.lanes]

    def _forward_stop(self) -> None:
        while not self._closed.is_set():
            if self._stop.wait(STOP_POLL_SECONDS):
                for helper in self.helpers:
                    helper.stop()
                # A helper that does not answer (stopped, hung) is killed: the push then ends
                # rather than waiting on it for good.
                deadline = time.monotonic() + EXIT_SECONDS
                for helper in self.helpers:
                    helper.answer_by(deadline)
                return

    def close(self) -> None:
        self._closed.set()
        if self._forward is not None:
            self._forward.join()
        for helper in self.helpers:
            helper.close()

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------ the helper's side

_serving = threading.local()  # .lane: the lane this thread answers on


class _LaneEnd:
    """A lane, from the helper's side: runs come in, what became of them goes out."""

    def __init__(self, requests_fd: int, replies_fd: int) -> None:
        self.requests = open(requests_fd, "rb")
        self.replies = open(replies_fd, "wb")

    def send(self, message: msgspec.Struct) -> None:
        _write_frame(self.replies, message)


def _reply(result: PushResult, refused: AuthError | None, stopped: bool) -> _Result:
    busy = result.busy
    return _Result(
        result.record,
        result.set_aside,
        _wire(result.error) if result.error is not None else None,
        result.already,
        _Busy(_wire(str(busy)), busy.pid, busy.host, busy.since) if busy is not None else None,
        result.uploaded_by,
        _wire(result.copy_of) if result.copy_of is not None else None,
        _wire(str(refused)) if refused is not None else None,
        stopped,
    )


def _progress(record: RunRecord) -> None:
    lane = getattr(_serving, "lane", None)
    if lane is not None:
        lane.send(_Progress(record))


def _serve(app: App, lane: _LaneEnd) -> None:
    """Upload each run the parent sends down `lane`, until it closes the lane (or is gone)."""
    from evalpush.push import push_one

    _serving.lane = lane
    try:
        while True:
            data = _read_frame(lane.requests)
            if data is None:
                return
            request = _REQUEST.decode(data)
            reply: _Result | _Failure
            try:
                directory = Path(os.fsdecode(request.path))
                result, refused = push_one(app, directory, request.waited_for)
                reply = _reply(result, refused, app.stop.is_set())
            except Exception as exc:  # noqa: BLE001 - the parent raises it as the push's failure
                reply = _Failure(type(exc).__name__, _wire(str(exc)))
            lane.send(reply)
    except (OSError, EOFError, ValueError, msgspec.DecodeError):
        app.request_stop()  # the parent is gone, or talks nonsense: stop what is in flight


def _stop_at_end(control: IO[bytes], app: App) -> None:
    """The parent closes the control pipe to stop this helper (or dies, and the kernel does)."""
    while control.read(4096):
        pass
    app.request_stop()


def main(argv: Sequence[str]) -> int:
    import gc
    import pickle

    # A Ctrl-C is the parent's to act on. It was blocked since before this process started
    # (`Helper`): ignored, one that came meanwhile is dropped.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    from evalpush import log
    from evalpush.app import App
    from evalpush.retry import Gate

    lanes = [tuple(int(fd) for fd in pair.split(":")) for pair in argv]
    control = sys.stdin.buffer
    config, log_level, log_format = pickle.load(control)
    log.configure(log_level, log_format, stream=sys.stderr)
    log.bind_process(helper=os.getpid())
    # The parent tells of outages; the helper's gate waits them out quietly.
    gate = Gate(one_shot=True, on_outage=lambda _outage: None)
    with App.from_config(config, progress=_progress, gate=gate, wait_on_auth=False) as app:
        signal.signal(signal.SIGTERM, lambda _signum, _frame: app.request_stop())
        threading.Thread(target=_stop_at_end, args=(control, app), daemon=True).start()
        gc.freeze()  # as the parent does: what is loaded by now is never garbage
        threads = [
            threading.Thread(target=_serve, args=(app, _LaneEnd(r, w)), name=f"upload-{i}")
            for i, (r, w) in enumerate(lanes)
        ]
        for thread in threads:
            thread.start()
        log.get_logger().info("helper process ready", pid=os.getpid(), lanes=len(lanes))
        for thread in threads:
            thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
