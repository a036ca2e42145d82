"""The runs stage: what a run directory is, who it is, and what kind of run it is.

A run directory holds `config.toml` and `traces.jsonl` (or the legacy `results.jsonl`), both
regular files. Its run id is the directory's leaf name when that is a UUID (the default
layout); otherwise it is the id the ledger already holds for that path (so the host being
renamed does not make it another run), and for a path the ledger does not know
`uuid5(NAMESPACE_URL, "evalpush:<hostname>:<absolute path>")`, which is stable across restarts
and does not collide across hosts (the path taken as the bytes the kernel knows it by, so a name
that is not UTF-8 has an id too).

Eval runs are uploaded; debug runs (config has `script_path` or `command`) never are; replay
runs (config has `num_rescores` and no `model`) only when `runs.upload_replays` is set.

Completion: `readiness` decides, purely from a run's `RunFacts` and `now`, whether it is finished
(the expected count of lines, the marker file, or no growth for `runs.settle_seconds`), and says
why not in words `status` shows; `LineCounter` keeps the cheap facts current by reading only the
bytes a trace file gained since it last looked.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from evalpush.config import ReadConfig, RunsConfig, read_toml
from evalpush.core.errors import RunError
from evalpush.core.ids import short_id
from evalpush.core.words import format_duration
from evalpush.runs.read import CHUNK_BYTES, FileIdentity, Line, identity_of, read_lines

CONFIG_FILE = "config.toml"
TRACES_FILE = "traces.jsonl"
LEGACY_TRACES_FILE = "results.jsonl"
DEFAULT_MODEL = "deepseek/deepseek-v4-flash"
CONFIGS_DIR = "configs"
RESOLVED_DIR = "resolved"


class RunKind(enum.StrEnum):
    EVAL = "eval"
    DEBUG = "debug"
    REPLAY = "replay"


RESOLVED_CONFIGS = {
    "eval.json": RunKind.EVAL,
    "debug.json": RunKind.DEBUG,
    "replay.json": RunKind.REPLAY,
}
"""verifiers 0.3/0.4 write the resolved config to `configs/resolved/<command>.json`: its name
says the kind of run."""


class Producer(enum.StrEnum):
    """Which producer's layout and push a run follows (docs/TRACE_FORMATS.md)."""

    TRACES = "traces"  # config.toml: verifiers 0.1 (the seed) and 0.2
    EPISODES_0_3 = "0.3"  # configs/resolved/<command>.json with num_tasks
    EPISODES_0_4 = "0.4"  # configs/resolved/<command>.json with select (prime-runs pushes)


class Run(msgspec.Struct, frozen=True):
    """One run directory and the fields of its config the upload needs."""

    path: Path
    run_id: str
    kind: RunKind
    traces_path: Path
    env_name: str
    model: str
    num_rollouts: int
    num_tasks: int | None
    pushed_inline: bool
    producer: Producer = Producer.TRACES
    name: str = ""  # the run's own name (0.3/0.4 `run.name`), its evaluation's name

    @property
    def evaluation_name(self) -> str:
        return self.name or f"{self.env_name}--{self.model}--{short_id(self.run_id)}"

    @property
    def config_path(self) -> Path:
        return config_file(self.path) or self.path / CONFIG_FILE

    @property
    def expected_traces(self) -> int | None:
        """How many trace lines a finished run has, when the config says."""
        return self.num_tasks * self.num_rollouts if self.num_tasks is not None else None


def _regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def traces_file(directory: Path) -> Path | None:
    """The run's trace file: `traces.jsonl`, else the legacy `results.jsonl`, else None."""
    for name in (TRACES_FILE, LEGACY_TRACES_FILE):
        if _regular_file(directory / name):
            return directory / name
    return None


def resolved_config(directory: Path) -> Path | None:
    """`configs/resolved/{eval,debug,replay}.json` (verifiers 0.3/0.4), the first there is."""
    resolved = directory / CONFIGS_DIR / RESOLVED_DIR
    for name in RESOLVED_CONFIGS:
        if _regular_file(resolved / name):
            return resolved / name
    return None


def config_file(directory: Path) -> Path | None:
    """The run's config: `config.toml` (0.1, 0.2), else its resolved JSON (0.3, 0.4)."""
    if _regular_file(directory / CONFIG_FILE):
        return directory / CONFIG_FILE
    return resolved_config(directory)


def _has_a_line(path: Path) -> bool:
    try:
        return os.lstat(path).st_size > 0
    except OSError:
        return False


def is_run_dir(directory: Path) -> bool:
    """config.toml + a trace file; or a resolved JSON config + a `traces.jsonl` that holds
    something (0.3/0.4 take their run id from the lines: a run with none has no id yet)."""
    traces = traces_file(directory)
    if traces is None:
        return False
    if _regular_file(directory / CONFIG_FILE):
        return True
    return (
        traces.name == TRACES_FILE
        and resolved_config(directory) is not None
        and _has_a_line(traces)
    )


def why_not_a_run(directory: Path) -> str | None:
    """Why `directory` is not a run directory, for people (None when it is one)."""
    try:
        directory.stat()
        os.listdir(directory)
    except PermissionError:
        return f"{directory} cannot be read (permission denied)"
    except NotADirectoryError:
        return f"{directory} is not a directory"
    except OSError as exc:
        return f"{directory}: {exc.strerror}"
    if is_run_dir(directory):
        return None
    config, traces = config_file(directory), traces_file(directory)
    if traces is None and (odd := _not_regular(directory / TRACES_FILE)) is not None:
        return odd
    if config is not None and traces is not None:
        return (
            f"{directory} holds {config.relative_to(directory)} and an empty {traces.name}: it "
            "is a run directory once its first line is written (the line says the run's id)"
        )
    if traces is not None:
        return (
            f"{directory} holds {traces.name} but no {CONFIG_FILE} (nor "
            f"{CONFIGS_DIR}/{RESOLVED_DIR}/eval.json), so it is not a run directory yet: it is "
            "one once its config is written"
        )
    if config is not None:
        return f"{directory} holds {config.relative_to(directory)} but no {TRACES_FILE} yet"
    return f"{directory} holds neither {CONFIG_FILE} nor {TRACES_FILE}: not a run directory"


def _not_regular(path: Path) -> str | None:
    """What `path` is when it is there but not a regular file, for people (else None)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        kind = f"a symlink (to {os.readlink(path)})"
        why = "a run's files are read only where they are, never through a symlink"
    else:
        kind = {
            stat.S_IFIFO: "a FIFO (named pipe)",
            stat.S_IFDIR: "a directory",
            stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device",
        }.get(stat.S_IFMT(mode), "not a file")
        why = "a run's trace file is a regular file"
    return f"{path} is {kind}, not a regular file: {why}"


def why_no_run(roots: Sequence[Path], *, most: int = 5) -> str:
    """Why no run directory is found at or under `roots`, for people: what looks like part of
    a run there (a trace file or a config, a symlinked directory, which are not followed) and
    why it is not taken; or that nothing of a run is there. At most `most` reasons."""
    reasons: list[str] = []
    for root in roots:
        if not root.is_dir() or root.is_symlink():
            reasons.append(why_not_a_run(root) or f"{root}: not a directory")
            continue
        for parent, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            here = Path(parent)
            names = {*dirs, *files}
            if names & {TRACES_FILE, LEGACY_TRACES_FILE, CONFIG_FILE, CONFIGS_DIR}:
                why = why_not_a_run(here)
                if why is not None:
                    reasons.append(why)
            for name in dirs:
                if (here / name).is_symlink():
                    reasons.append(f"{here / name} is a symlink to a directory: not followed")
            if len(reasons) >= most:
                break
    if not reasons:
        return "nothing there holds a trace file or a run's config"
    return "; ".join(reasons[:most]) + ("; ..." if len(reasons) > most else "")


def find_run_dirs(root: Path) -> Iterator[Path]:
    """Every run directory at or under `root`, without following symlinks, in sorted order."""
    if is_run_dir(root):
        yield root
        return
    for parent, dirs, _files in os.walk(root, followlinks=False):
        dirs.sort()
        here = Path(parent)
        for name in list(dirs):
            # os.walk lists a symlink to a directory among `dirs`: never follow it out of the root
            if not (here / name).is_symlink() and is_run_dir(here / name):
                dirs.remove(name)  # a run directory does not nest runs
                yield here / name


KnownRunId = Callable[[Path], str | None]
"""The run id a ledger already knows for a directory at this path, if any."""


def derive_run_id(directory: Path, known: KnownRunId | None = None) -> str:
    """The run id of `directory`: its leaf name when that is a UUID; else the run id its last
    complete line carries (`run.id`: 0.2 on; a resumed 0.3/0.4 run's lines carry the id of the
    attempt that wrote them, and the last attempt's is the run's; before a whole line is in,
    the daemon's tracker records the run under a stand-in from below and renames it once a line
    names it, `named_by_lines_later`); else the id the ledger
    already knows for this path (`known`), so a run keeps its id when the host is renamed; else
    `uuid5(hostname + absolute path)`."""
    try:
        return str(uuid.UUID(directory.name))
    except ValueError:
        pass
    from_lines = last_run_id(directory)
    if from_lines:
        return from_lines
    absolute = directory.absolute()
    already = known(absolute) if known is not None else None
    if already:
        return already
    key = b"evalpush:%s:%s" % (socket.gethostname().encode(), os.fsencode(absolute))
    return str(_uuid5(uuid.NAMESPACE_URL, key))


def named_by_lines_later(directory: Path) -> bool:
    """Whether `derive_run_id`'s answer for `directory` is a stand-in that a line written later
    replaces: its name is not a UUID and no complete line of its trace file names the run yet
    (a 0.3/0.4 run found before its first rollout finished)."""
    try:
        uuid.UUID(directory.name)
        return False
    except ValueError:
        return last_run_id(directory) is None


class _RunRef(msgspec.Struct, gc=False):
    id: Any = None


class _RunOfLine(msgspec.Struct, gc=False):
    run: _RunRef | None = None


_RUN_OF_LINE = msgspec.json.Decoder(_RunOfLine)
TAIL_CHUNK_BYTES = 64 * 1024


def last_run_id(directory: Path) -> str | None:
    """The run id (`run.id`) of the last complete line of the directory's trace file, if that
    line is an object carrying one. The tail is read backwards, never more than one line of
    `read.max_line_bytes`."""
    traces = traces_file(directory)
    if traces is None:
        return None
    line = _last_line(traces, ReadConfig().max_line_bytes)
    if not line:
        return None
    try:
        found = _RUN_OF_LINE.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    run_id = found.run.id if found.run is not None else None
    return run_id if isinstance(run_id, str) and run_id else None


def _last_line(path: Path, limit: int) -> bytes | None:
    """The last `\n`-terminated line of `path` (a half-written one after it ignored)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        end = os.fstat(fd).st_size
        tail = b""
        position = end
        while position > 0 and len(tail) <= limit + 1:
            start = max(0, position - TAIL_CHUNK_BYTES)
            tail = os.pread(fd, position - start, start) + tail
            position = start
            last = tail.rfind(b"\n")
            if last < 0:
                continue
            before = tail.rfind(b"\n", 0, last)
            if before >= 0 or position == 0:
                line = tail[before + 1 : last]
                return line if line.strip() else None
        return None
    except OSError:
        return None
    finally:
        os.close(fd)


def _uuid5(namespace: uuid.UUID, name: bytes) -> uuid.UUID:
    """`uuid.uuid5` of a name given as bytes (for a UTF-8 name, the same id as `uuid5(str)`)."""
    digest = hashlib.sha1(namespace.bytes + name, usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def _kind(config: dict[str, Any]) -> RunKind:
    if "script_path" in config or "command" in config:
        return RunKind.DEBUG
    if "num_rescores" in config and "model" not in config:
        return RunKind.REPLAY
    return RunKind.EVAL


def _int_key(config: dict[str, Any], key: str, default: int | None, path: Path) -> int | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RunError(f"{path}: key {key!r} must be a non-negative integer, got {value!r}")
    return value


def load_run(directory: Path, known: KnownRunId | None = None) -> Run:
    """Read a run directory's identity (`derive_run_id`, with `known`) and config; `RunError`
    names what is wrong."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    traces = traces_file(directory)
    if traces is None:
        raise RunError(f"{directory}: no traces.jsonl (or results.jsonl): not a run directory")
    if not _regular_file(config_path):
        resolved = resolved_config(directory)
        if resolved is None:
            raise RunError(
                f"{config_path}: no config.toml (nor {CONFIGS_DIR}/{RESOLVED_DIR}/eval.json): "
                "not a run directory"
            )
        return _load_resolved(directory, resolved, traces, known)
    config = read_toml(config_path, RunError, "config.toml")
    taskset = config.get("taskset")
    taskset_id = taskset.get("id") if isinstance(taskset, dict) else None
    env_name = taskset_id or config.get("id") or ""
    model = config.get("model") or DEFAULT_MODEL
    if not isinstance(env_name, str) or not isinstance(model, str):
        raise RunError(f"{config_path}: 'taskset.id', 'id' and 'model' must be strings")
    return Run(
        path=directory,
        run_id=derive_run_id(directory, known),
        kind=_kind(config),
        traces_path=traces,
        env_name=env_name,
        model=model,
        num_rollouts=_int_key(config, "num_rollouts", 1, config_path) or 0,
        num_tasks=_int_key(config, "num_tasks", None, config_path),
        pushed_inline=bool(config.get("push", True)),
    )


def _load_resolved(
    directory: Path, config_path: Path, traces: Path, known: KnownRunId | None
) -> Run:
    """A 0.3/0.4 run: its resolved JSON config (`env.taskset.id`, `model`, `num_rollouts`,
    `run.name`, `push`; the task count `num_tasks` in 0.3, `select.limit` in 0.4)."""
    try:
        config = msgspec.json.decode(config_path.read_bytes())
    except OSError as exc:
        raise RunError(f"{config_path}: cannot be read: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise RunError(f"{config_path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise RunError(f"{config_path}: not a JSON object")
    env, run, select = (_section(config, key, config_path) for key in ("env", "run", "select"))
    taskset = _section(env, "taskset", config_path, "env.")
    env_name, model, name = taskset.get("id") or "", config.get("model"), run.get("name") or ""
    if not isinstance(env_name, str) or not isinstance(name, str):
        raise RunError(f"{config_path}: 'env.taskset.id' and 'run.name' must be strings")
    if not isinstance(model, str) or not model:
        raise RunError(f"{config_path}: 'model' must be a non-empty string, got {model!r}")
    producer = Producer.EPISODES_0_4 if "select" in config else Producer.EPISODES_0_3
    if producer == Producer.EPISODES_0_4:
        num_tasks = _int_key(select, "limit", None, config_path)
    else:
        num_tasks = _int_key(config, "num_tasks", None, config_path)
    return Run(
        path=directory,
        run_id=derive_run_id(directory, known),
        kind=RESOLVED_CONFIGS[config_path.name],
        traces_path=traces,
        env_name=env_name,
        model=model,
        num_rollouts=_int_key(config, "num_rollouts", 1, config_path) or 0,
        num_tasks=num_tasks,
        pushed_inline=bool(config.get("push", True)),
        producer=producer,
        name=name,
    )


def _section(config: dict[str, Any], key: str, path: Path, at: str = "") -> dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RunError(f"{path}: '{at}{key}' must be an object, got {type(value).__name__}")
    return value


def require_env_name(run: Run) -> str:
    if not run.env_name:
        keys = (
            "'[taskset] id' and 'id' are both empty"
            if run.producer == Producer.TRACES
            else "'env.taskset.id' is empty"
        )
        raise RunError(f"{run.config_path}: no environment name ({keys}): nothing to upload to")
    return run.env_name


# Completion: when a run is finished (docs/ARCHITECTURE.md, "Readiness"). Everything below
# is cheap to observe and decided by one pure function, so the daemon can re-decide on every
# event and every rescan, and `status` can say why a run still waits.


class ReadyRule(enum.StrEnum):
    """Which rule found a run finished (the first that holds, in docs/ARCHITECTURE.md's order ("Readiness"))."""

    EXPECTED_COUNT = "expected count"
    MARKER = "marker"
    SETTLED = "settled"


class ReadinessRules(msgspec.Struct, frozen=True):
    """The configured rules: `runs.settle_seconds` and `runs.marker` ("" turns the marker off)."""

    settle_seconds: float
    marker: str = ""

    @classmethod
    def from_config(cls, runs: RunsConfig) -> ReadinessRules:
        return cls(settle_seconds=runs.settle_seconds, marker=runs.marker)


class RunFacts(msgspec.Struct, frozen=True, gc=False):
    """What readiness looks at; every field is cheap to observe (see `LineCounter`).

    Times are wall-clock epoch seconds (`time.time()`), the clock file mtimes are in.
    """

    lines: int  # complete (`\n`-terminated) trace lines
    expected: int | None  # `Run.expected_traces`: None when config.toml has no num_tasks
    marker_present: bool  # the marker file exists in the run directory
    mtime: float  # the trace file's modification time
    grown_at: float | None  # when the daemon last saw the file grow, or first looked at it
    again_after: float | None = None  # a finalized run that changed: no new upload before this

    @property
    def last_growth(self) -> float:
        # The later of the two: mtime alone would trust another host's clock (NFS: a file
        # server behind this host's clock makes a file being written look settled), so the
        # settle time counts at least from the daemon's own first look at the file.
        return self.mtime if self.grown_at is None else max(self.mtime, self.grown_at)


class Readiness(msgspec.Struct, frozen=True, gc=False):
    """A run's readiness: `ready` with the `rule` that fired, or waiting; `reason` is for people."""

    ready: bool
    rule: ReadyRule | None
    reason: str
    settles_at: float  # when the settle rule fires if the file does not grow again
    progress: str = ""  # a waiting run's reason without the countdown (what the ledger keeps)


MARKER_SETTLE_SECONDS = 10.0
"""A run past its expected count with its marker present is finished once its file has not grown
for this long (or `runs.settle_seconds`, if shorter): a marker left in place while lines keep
coming must not finish it at every line."""


def readiness(facts: RunFacts, now: float, rules: ReadinessRules) -> Readiness:
    """Is the run finished? The first rule that holds, in order: expected count, marker, settle.

    A run whose file holds more lines than expected is still being written (or was resumed): the
    expected count no longer says it is finished, so it waits for its file to settle, or for its
    marker and a short quiet (`MARKER_SETTLE_SECONDS`). A finalized run that changed
    (`again_after`) is not finished before that time, whatever the rules say: it is uploaded
    again at most once per settle period while it keeps changing.

    Pure: the same facts and `now` give the same answer, so a caller can ask as often as it likes
    and wake itself at `settles_at` instead of polling.
    """
    settles_at = facts.last_growth + rules.settle_seconds
    count = (
        f"{facts.lines} traces"
        if facts.expected is None
        else f"{facts.lines}/{facts.expected} traces"
    )
    past = facts.expected is not None and facts.lines > facts.expected
    marker = bool(rules.marker) and facts.marker_present
    quiet_at = facts.last_growth + min(MARKER_SETTLE_SECONDS, rules.settle_seconds)
    decided: tuple[ReadyRule, str] | None = None
    if facts.expected is not None and facts.lines == facts.expected:
        decided = ReadyRule.EXPECTED_COUNT, f"{count}: the expected count"
    elif marker and (not past or now >= quiet_at):
        quiet = f", no growth for {format_duration(now - facts.last_growth)}" if past else ""
        decided = ReadyRule.MARKER, f"marker {rules.marker} present ({count}{quiet})"
    elif now >= settles_at:
        quiet = format_duration(now - facts.last_growth)
        decided = ReadyRule.SETTLED, f"no growth for {quiet} ({count})"
    again_after = facts.again_after
    if decided is not None and (again_after is None or now >= again_after):
        return Readiness(True, decided[0], decided[1], settles_at)
    waiting = [count]
    if past:
        waiting.append("past the expected count: waits for the file to settle")
    if rules.marker and not facts.marker_present:
        waiting.append(f"no marker {rules.marker} yet")
    wake = min(settles_at, quiet_at) if marker and past else settles_at
    if decided is not None and again_after is not None:
        wake = again_after
        waiting.append("changed after it was finalized, again")
        reason = f"{', '.join(waiting)}; uploads again in {format_duration(math.ceil(wake - now))}"
        return Readiness(False, None, reason, wake, ", ".join(waiting))
    progress = ", ".join(waiting)
    reason = f"{progress}, {settles_in(wake, now)}"
    return Readiness(False, None, reason, wake, progress)


def settles_in(settles_at: float, now: float) -> str:
    """The settle rule's countdown, for people: `settles in 4m12s` (`settles now` once due)."""
    if settles_at <= now:
        return "settles now"
    return f"settles in {format_duration(math.ceil(settles_at - now))}"


class LineCount(msgspec.Struct, frozen=True, gc=False):
    """A trace file as a `LineCounter` last saw it."""

    lines: int  # complete lines
    offset: int  # just past the last complete line
    size: int  # the file's size when looked at (bytes past `offset` are a half-written line)
    mtime: float  # its modification time, epoch seconds
    grown_at: float | None  # when it was seen growing, or first looked at (the counter's clock)
    replaced: bool  # replaced, shrunk or rewritten since the last look: restarted from 0
    file: FileIdentity  # the file looked at (device, inode, size, mtime, ctime), as it was then


class LineSink(Protocol):
    """Where a `LineCounter` feeds the lines it reads, for running totals kept as lines arrive."""

    def restart(self) -> None:
        """The file was replaced or truncated: forget every line fed so far."""

    def line(self, line: Line) -> None:
        """The next complete line, in file order (`line.data` None: over `max_line_bytes`)."""


REWRITE_WINDOW_BYTES = 4096
"""Feeding a sink, the counter keeps this many bytes from the file's start and from just before
the end of what it fed, and reads them back whenever the file's stat changed: different bytes
there mean the file was rewritten in place (its inode kept), and what was fed is void."""


class LineCounter:
    """Counts the complete lines of a growing trace file, reading only bytes it has not seen.

    Each `update()` opens the file (never through a symlink), and reads from where the last one
    stopped: counting `\\n` bytes in 1 MiB chunks with no decoding, or, given a `LineSink`, handing
    every new complete line to it (through `read.read_lines`). A half-written last line is not
    counted until its `\\n` arrives. Another inode at the path, or a file smaller than last time,
    restarts the count from 0 (and calls `sink.restart()` first). Feeding a sink, so does a file
    rewritten in place: whenever the file's stat changed, `REWRITE_WINDOW_BYTES` at its start
    and just before the end of what was fed are read back and must be the bytes fed. (A rewrite
    that keeps both windows and changes only bytes between them goes unseen: an append-only
    producer never does that, and `--resume` replaces the file.) Raises `OSError` when the file
    is gone or not a regular file. No I/O until `update()`; one counter per file, one thread.

    A new counter's first `update()` reads the whole file; `resume()` starts from a point known
    from before (the ledger's), so a restarted daemon does not re-read what it already counted.
    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.time,
        max_line_bytes: int = ReadConfig().max_line_bytes,
    ) -> None:
        self.path = path
        self._clock = clock
        self._max_line_bytes = max_line_bytes
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file counted
        self._size = 0  # its size at the last look
        self._stat: tuple[int, int, int] | None = None  # (size, mtime_ns, ctime_ns) then
        self._lines = 0
        self._offset = 0  # just past the last complete line counted
        self._scanned = 0  # bytes already looked at (>= offset: a half-written line's bytes)
        self._looked = False  # an update() ran: from then on, a change of size is growth seen
        self._grown_at: float | None = None
        self._windows: tuple[bytes, bytes] | None = None  # fed bytes: the head, before offset

    @classmethod
    def resume(
        cls, path: Path, file: FileIdentity, offset: int, lines: int, **options: Any
    ) -> LineCounter:
        """A counter that knows `lines` complete lines end at `offset` in `file` (as it was then)."""
        counter = cls(path, **options)
        counter._identity, counter._size = (file.device, file.inode), file.size
        counter._offset = counter._scanned = offset
        counter._lines = lines
        return counter

    def update(self, sink: LineSink | None = None) -> LineCount:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileNotFoundError(f"{self.path}: not a regular file")
            file = identity_of(st)
            replaced = self._notice(st, sink, fd)
            if sink is None:
                self._windows = None  # bytes counted but not fed: nothing to compare later
                self._count(fd, st.st_size)
            else:
                self._feed(sink, file)
                self._windows = self._read_windows(fd)
        finally:
            os.close(fd)
        mtime = st.st_mtime_ns / 1e9
        return LineCount(
            self._lines, self._offset, st.st_size, mtime, self._grown_at, replaced, file
        )

    def _notice(self, st: os.stat_result, sink: LineSink | None, fd: int) -> bool:
        """Take in the file's stat: restart on a replacement (or, feeding a sink, a rewrite in
        place), time growth; whether it was replaced."""
        now = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        replaced = self._identity is not None and (
            (st.st_dev, st.st_ino) != self._identity
            or st.st_size < self._size
            or (sink is not None and now != self._stat and self._rewritten(fd))
        )
        if replaced:
            self._lines = self._offset = self._scanned = 0
            self._windows = None
            if sink is not None:
                sink.restart()
        if not self._looked or replaced or st.st_size != self._size:
            # The first look counts as a sighting: a file's mtime is the file server's clock,
            # and a host whose clock runs ahead of it would take a file being written for one
            # that settled long ago.
            self._grown_at = self._clock()
        self._identity, self._size, self._looked = (st.st_dev, st.st_ino), st.st_size, True
        self._stat = now
        return replaced

    def _read_windows(self, fd: int) -> tuple[bytes, bytes] | None:
        """The fed bytes kept to tell a rewrite in place: the file's first ones and the last
        ones before the offset (None: nothing fed yet)."""
        if not self._offset:
            return None
        width = min(REWRITE_WINDOW_BYTES, self._offset)
        return os.pread(fd, width, 0), os.pread(fd, width, self._offset - width)

    def _rewritten(self, fd: int) -> bool:
        """Whether the bytes kept from the last feed are other bytes now."""
        if self._windows is None:
            return False
        return self._read_windows(fd) != self._windows

    def _count(self, fd: int, size: int) -> None:
        position = self._scanned
        while position < size:
            chunk = os.pread(fd, min(CHUNK_BYTES, size - position), position)
            if not chunk:
                break
            newlines = chunk.count(b"\n")
            if newlines:
                self._lines += newlines
                self._offset = position + chunk.rindex(b"\n") + 1
            position += len(chunk)
        self._scanned = position

    def _feed(self, sink: LineSink, file: FileIdentity) -> None:
        for line in read_lines(
            self.path,
            offset=self._offset,
            number=self._lines,
            end=file.size,
            max_line_bytes=self._max_line_bytes,
            expect=file,
        ):
            sink.line(line)
            self._lines, self._offset = line.number, line.end
        self._scanned = max(self._scanned, self._offset)
