"""What `status` shows: the table and JSON rows of the ledger's runs, one run in full, and the
daemons' view (`push`'s lines are `evalpush.cli.push_report`'s).

A run's `holder` is the live process holding its claim (pid, host, since), or none. A run left
`uploading` that no live process holds (its uploader was killed, or stopped on a ledger error)
shows as `ready`, interrupted: the next push resumes it.

A ledger may hold a million runs. `status` by default reads only what it shows (`overview`):
how many runs are in each state, the runs that need a person, and the runs updated last. Every
row (`status --all`, `--json`) is read, made and printed a page at a time (`row_pages`,
`detail_pages`, `TableLines`), so its memory does not grow with the ledger.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from evalpush.core import paths
from evalpush.core.ids import short_id
from evalpush.core.outage import AUTH, PAUSED, UNREACHABLE, Outage, OutageEvent
from evalpush.core.setaside import SetAside
from evalpush.core.states import FOLLOWING, State
from evalpush.core.words import counted, format_duration
from evalpush.ledger import Holder, Ledger, Process, RunRecord, alive_now, reads
from evalpush.ledger.records import DaemonRecord, HistoryRecord
from evalpush.runs import settles_in

Alive = Callable[[Holder], bool]


def _holder(record: RunRecord, alive: Alive) -> dict[str, Any] | None:
    holder = record.holder
    if holder is None or not alive(holder):
        return None
    return {"pid": holder.pid, "host": holder.host, "since": holder.since}


def _row(record: RunRecord, set_aside: int, holder: dict[str, Any] | None) -> dict[str, Any]:
    state, reason = record.state, record.reason
    if record.following and state in (State.WAITING, State.UPLOADING):
        return _row_fields(record, set_aside, holder, FOLLOWING, _following(record, holder))
    if state == State.UPLOADING and holder is None:
        state = State.READY
        reason = f"interrupted at step {record.step} (no process is uploading it); push resumes it"
    elif state == State.UPLOADING and not reason:
        reason = f"at step {record.step}"
    elif state == State.WAITING and record.settles_at is not None:
        reason = ", ".join(filter(None, (reason, settles_in(record.settles_at, time.time()))))
    return _row_fields(record, set_aside, holder, state, reason)


def _following(record: RunRecord, holder: dict[str, Any] | None) -> str:
    """A followed run: the age of its last batch, and what it waits for."""
    words = []
    if record.followed_at is not None:
        words.append(f"last batch {format_duration(time.time() - record.followed_at)} ago")
    if record.state == State.UPLOADING:
        words.append("sending a batch" if holder is not None else "a batch interrupted")
    elif record.reason:
        words.append(record.reason)
    if record.state == State.WAITING and record.settles_at is not None:
        words.append(settles_in(record.settles_at, time.time()))
    return "; ".join(filter(None, words))


def _row_fields(
    record: RunRecord, set_aside: int, holder: dict[str, Any] | None, state: str, reason: str
) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "path": record.path,
        "state": state,
        "reason": reason,
        "samples_sent": record.samples_sent,
        "samples_seen": record.samples_seen,
        "expected_traces": record.expected_traces,
        "missing_traces": record.missing_traces(set_aside),
        "set_aside": set_aside,
        "evaluation_id": record.evaluation_id,
        "url": record.viewer_url,
        "last_error": record.last_error,
        "attempts": record.attempts,
        "updated_at": record.updated_at,
        "holder": holder,
    }


_HISTORY_REASONS = {
    "superseded": "superseded: the run changed after this evaluation was finalized",
    "cancelled": "closed out: the trace file was replaced or deleted mid-upload",
    "deleted": "deleted on the platform mid-upload; uploaded again",
    "closed": "closed on the platform mid-upload; uploaded again",
    "duplicate": "a second evaluation of this run (an older evalpush saw it at another path)",
}


def _superseded(record: RunRecord, earlier: HistoryRecord) -> dict[str, Any]:
    """The row of an evaluation a run had before its current one (state `superseded`)."""
    return {
        **_row(record, 0, None),
        "state": State.SUPERSEDED,
        "reason": _HISTORY_REASONS.get(earlier.outcome, earlier.outcome),
        "samples_sent": None,
        "samples_seen": None,
        "missing_traces": 0,
        "evaluation_id": earlier.evaluation_id,
        "url": earlier.viewer_url,
        "last_error": None,
        "updated_at": earlier.at,
    }


def row_pages(
    ledger: Ledger, pages: Iterable[list[RunRecord]], alive: Alive | None = None
) -> Iterator[list[dict[str, Any]]]:
    """Each page of runs as `status` rows: a run's row, then one per earlier evaluation of it
    (state `superseded`); two queries a page (what its runs set aside, and had before)."""
    alive = alive or alive_now()
    for records in pages:
        counts, history = ledger.set_aside_counts_of(records), ledger.history_of(records)
        rows = []
        for record in records:
            rows.append(_row(record, counts.get(record.id, 0), _holder(record, alive)))
            rows += [_superseded(record, earlier) for earlier in history.get(record.id, ())]
        yield rows


def status_rows(ledger: Ledger, alive: Alive | None = None) -> list[dict[str, Any]]:
    """One row per run, then one per earlier evaluation of a run (state `superseded`): every
    row at once, for a ledger known to be small (the demo's)."""
    return [row for rows in row_pages(ledger, ledger.pages(), alive) for row in rows]


def run_detail(ledger: Ledger, record: RunRecord, alive: Alive | None = None) -> dict[str, Any]:
    """One run in full: what `status RUN` shows, and each object of `status --json`."""
    return _detail(record, ledger.set_aside(record), ledger.history(record), alive or alive_now())


def detail_pages(
    ledger: Ledger, pages: Iterable[list[RunRecord]], alive: Alive | None = None
) -> Iterator[list[dict[str, Any]]]:
    """`run_detail` of each run, a page at a time: two queries a page."""
    alive = alive or alive_now()
    for records in pages:
        set_aside, history = ledger.set_aside_of(records), ledger.history_of(records)
        yield [
            _detail(record, set_aside.get(record.id, []), history.get(record.id, []), alive)
            for record in records
        ]


def _detail(
    record: RunRecord, set_aside: list[SetAside], history: list[HistoryRecord], alive: Alive
) -> dict[str, Any]:
    holder = _holder(record, alive)
    row = _row(record, len(set_aside), holder)
    claim = record.holder
    evaluations = [
        {
            "evaluation_id": earlier.evaluation_id,
            "url": earlier.viewer_url,
            "outcome": earlier.outcome,
            "why": _HISTORY_REASONS.get(earlier.outcome, earlier.outcome),
            "at": earlier.at,
        }
        for earlier in history
    ]
    if record.evaluation_id is not None:
        evaluations.append(
            {
                "evaluation_id": record.evaluation_id,
                "url": record.viewer_url,
                "outcome": "current",
                "why": "finalized" if record.state == State.FINALIZED else "open",
                "at": record.finalized_at,
            }
        )
    return {
        **row,
        "kind": record.kind,
        "step": record.step,
        "bytes_sent": record.bytes_sent,
        "trace_bytes": record.upload_end,
        "acked_bytes": record.acked_offset,
        "last_error_at": record.last_error_at if record.last_error else None,
        "claim": None
        if claim is None
        else {
            "pid": claim.pid,
            "host": claim.host,
            "since": claim.since,
            "lease_expires": claim.expires,
            "alive": holder is not None,
        },
        "created_at": record.created_at,
        "finalized_at": record.finalized_at,
        "settles_at": record.settles_at,
        "evaluations": evaluations,
        "set_aside_records": [item.as_json() for item in set_aside],
    }


SETTLED = (State.FINALIZED, State.SKIPPED)
"""The states a run rests in: one in any other state waits, is under way, or needs a person."""
NEEDS_PERSON_SHOWN = 100
"""At most this many runs needing a person are listed by the default `status` (the ones updated
last; the counts say how many there are)."""
LATEST_SHOWN = 20
"""The default `status` lists this many of the other runs: the ones updated last."""


class Overview(msgspec.Struct, frozen=True):
    """What the default `status` shows of a ledger, read through its indexes (schema 10): how
    many runs are in each state; the runs needing a person (any not finalized or skipped, and
    those finalized partial or with records set aside), how many in all and of which kind, and
    the `NEEDS_PERSON_SHOWN` of them updated last; and the `LATEST_SHOWN` other runs updated
    last, and how many of those there are."""

    counts: dict[str, int]
    needs_person: list[RunRecord]
    needs_person_total: int
    partial: int
    with_set_aside: int
    latest: list[RunRecord]
    others_total: int

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def overview(ledger: Ledger, counts: dict[str, int]) -> Overview:
    """The default `status`'s view of a ledger holding `counts` runs in each state
    (`state_counts`): a few queries, each bounded by what it shows or by the runs needing a
    person, however many runs the ledger holds."""
    unsettled = [state for state in State if counts.get(state) and state not in SETTLED]
    short = dict(ledger.short(State.FINALIZED))
    aside = dict(ledger.set_aside_runs(*SETTLED))
    # A short run whose set-aside records make up the difference is not partial (it is listed
    # for its records).
    both = ledger.by_ids(short.keys() & aside.keys())
    covered = ledger.set_aside_counts_of(both)
    partial = [r.id for r in both if r.missing_traces(covered.get(r.id, 0))]
    settled_needing = short | aside
    candidates = list(settled_needing.items())
    for state in unsettled:
        candidates += ledger.newest(state, NEEDS_PERSON_SHOWN)
    shown = sorted(candidates, key=lambda c: c[1], reverse=True)[:NEEDS_PERSON_SHOWN]
    latest: list[tuple[int, float]] = []
    for state in SETTLED:
        if counts.get(state):
            latest += ledger.newest(state, LATEST_SHOWN, clean=True)
    latest = sorted(latest, key=lambda c: c[1], reverse=True)[:LATEST_SHOWN]
    return Overview(
        counts=counts,
        needs_person=ledger.by_ids(row_id for row_id, _ in shown),
        needs_person_total=sum(counts[state] for state in unsettled) + len(settled_needing),
        partial=len(short.keys() - aside.keys()) + len(partial),
        with_set_aside=len(aside),
        latest=ledger.by_ids(row_id for row_id, _ in latest),
        others_total=sum(counts.get(state, 0) for state in SETTLED) - len(settled_needing),
    )


def counts_text(counts: dict[str, int]) -> str:
    """`1,000,000 finalized, 12 failed`: the runs in each state, in the states' order."""
    return ", ".join(f"{counts[state]:,} {state}" for state in State if counts.get(state))


def needs_person_text(view: Overview) -> str:
    """The heading of the runs needing a person: how many, of which kind, and which are
    listed."""
    if not view.needs_person_total:
        return "needs a person: none"
    kinds = [
        f"{view.counts[state]:,} {state}"
        for state in State
        if view.counts.get(state) and state not in SETTLED
    ]
    if view.partial:
        kinds.append(f"{view.partial:,} partial")
    if view.with_set_aside:
        kinds.append(f"{view.with_set_aside:,} with records set aside")
    text = f"needs a person: {counted(view.needs_person_total, 'run')} ({', '.join(kinds)})"
    if view.needs_person_total > len(view.needs_person):
        text += f"; the {len(view.needs_person)} updated last:"
    return text


def latest_text(view: Overview) -> str | None:
    """The heading of the other runs (finalized or skipped, nothing to look at) listed; None
    when there are none."""
    if not view.others_total:
        return None
    if view.others_total > len(view.latest):
        others = counted(view.others_total, "other run")
        return f"latest: {len(view.latest)} of {others}, the ones updated last:"
    return f"latest: {counted(view.others_total, 'other run')}"


def not_shown_text(view: Overview) -> str | None:
    """The line saying how many runs the default view left out, and how to see them."""
    hidden = view.others_total - len(view.latest)
    hidden += view.needs_person_total - len(view.needs_person)
    if hidden <= 0:
        return None
    return (
        f"({hidden:,} more not shown: `evalpush status --all` lists every run; "
        "`--state S`, `--limit N` pick some)"
    )


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(seconds))


def _nbytes(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count:,} B" if count < 1000 else f"{count:,} B ({count / 1e6:.1f} MB)"


MISSING_FIX = (
    ": the eval stopped short; resumed into the same directory, the whole run is uploaded again"
    " and its evaluation supersedes this one"
)


def _missing_text(row: dict[str, Any]) -> str:
    """`10 of 40 expected traces missing` (a partial run)."""
    return f"{row['missing_traces']:,} of {row['expected_traces']:,} expected traces missing"


def detail_text(detail: dict[str, Any]) -> str:
    """`status RUN`: one run in full, a labelled line per fact, then its evaluations and its
    set-aside records."""
    lines = [
        ("run", detail["run_id"]),
        ("path", detail["path"]),
        ("kind", detail["kind"]),
        ("state", detail["state"] + (f": {detail['reason']}" if detail["reason"] else "")),
        ("step", detail["step"]),
        (
            "samples",
            f"{detail['samples_sent']:,} sent of {detail['samples_seen']:,} seen, "
            f"{_nbytes(detail['bytes_sent'])} of requests",
        ),
        (
            "trace file",
            f"{_nbytes(detail['acked_bytes'])} acknowledged of {_nbytes(detail['trace_bytes'])}"
            " scanned"
            if detail["trace_bytes"] is not None
            else "not scanned yet",
        ),
        ("attempts", str(detail["attempts"])),
    ]
    if detail["expected_traces"] is not None:
        lines.insert(6, ("expected", f"{detail['expected_traces']:,} traces (its config.toml)"))
    if detail["missing_traces"]:
        lines.insert(7, ("PARTIAL", _missing_text(detail) + MISSING_FIX))
    if detail["last_error"]:
        lines.append(
            ("last error", f"{detail['last_error']} (at {_when(detail['last_error_at'])})")
        )
    claim = detail["claim"]
    if claim is None:
        lines.append(("claim", "nobody holds it"))
    else:
        who = holder_text(claim) if claim["alive"] else f"pid {claim['pid']} on {claim['host']}"
        lines.append(
            ("claim", who + ("" if claim["alive"] else " (gone: the next push takes it over)"))
        )
    lines += [
        ("created", _when(detail["created_at"])),
        ("updated", _when(detail["updated_at"])),
        ("finalized", _when(detail["finalized_at"])),
    ]
    if detail["settles_at"] is not None and detail["state"] == State.WAITING:
        lines.append(("settles", _when(detail["settles_at"])))
    out = [f"{label + ':':<12}{value}" for label, value in lines]
    out.append(f"evaluations: {len(detail['evaluations']) or 'none yet'}")
    for evaluation in detail["evaluations"]:
        out.append(
            f"  {evaluation['outcome']:<11} {evaluation['url'] or evaluation['evaluation_id']}"
            f"  {evaluation['why']}, {_when(evaluation['at'])}"
        )
    records = detail["set_aside_records"]
    out.append(f"set aside:  {len(records) or 'nothing'}")
    for item in records:
        out.append(
            f"  line {item['line']}, offset {item['offset']}, {item['size']:,} B, "
            f"{item['kind']}: {item['reason']}"
        )
    return paths.printable("\n".join(out))


def local_daemon(
    daemons: list[DaemonRecord], *, shared: bool, now: float | None = None
) -> tuple[DaemonRecord | None, DaemonRecord | None]:
    """The daemon `status` speaks of, from the ledger's `daemons` rows (the last heard from
    first): (the one whose process runs, None), or (None, the one last seen; None when none ever
    ran). A file's rows are its state dir's daemons; a shared ledger's, this host's only."""
    here, alive = Process.current(), alive_now(now)
    mine = [d for d in daemons if not shared or d.host == here.host]
    for d in mine:
        if d.process_lives(alive):
            return d, None
    return None, (mine[0] if mine else None)


def daemon_text(daemon: DaemonRecord, now: float | None = None) -> str:
    """The running daemon's line for `status`: who it is and what the platform is doing."""
    now = time.time() if now is None else now
    where = "" if daemon.host == socket.gethostname() else f" on {daemon.host}"
    gate = daemon.gate
    if gate.mode in (UNREACHABLE, AUTH, PAUSED) and gate.since is not None:
        next_at = gate.next_probe_at
        platform = Outage(
            OutageEvent.ONGOING,
            gate.mode,
            now - gate.since,
            gate.attempts,
            None if next_at is None else max(0.0, next_at - now),
            gate.runs_waiting,
            gate.reason,
        ).message
    else:
        platform = "platform reachable"
    runs = daemon.status.split(", platform ")[0]  # the STATUS line's counts; its gate is above
    line = f"daemon:     pid {daemon.pid}{where}: {platform} ({runs})"
    age = max(0.0, now - daemon.seen_at)
    if age >= daemon.silent_after():
        line += f"; last heard from {format_duration(age)} ago"
    return line


def holder_text(holder: dict[str, Any] | None) -> str:
    """`pid 123 since 14:02:07` (`on HOST` added for another host), or empty."""
    if holder is None:
        return ""
    where = "" if holder["host"] == socket.gethostname() else f" on {holder['host']}"
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"]))
    return f"pid {holder['pid']}{where} since {since}"


TABLE_COLUMNS = 120
"""The default table fits this many columns: one line per run, its detail cut to fit (the full
reason and path are in `status RUN`)."""


_HEADER = ("RUN", "STATE", "SENT/EXPECTED", "ASIDE", "HOLDER", "EVALUATION", "DETAIL")


class TableLines:
    """The runs one a line, fitting TABLE_COLUMNS (`wide`, the demo's: with each viewer URL and
    path, however wide that makes it), for rows that come a page at a time: each page's lines
    are made as it comes, in columns as wide as the widest cell so far (a page with a wider
    cell widens the columns from there on)."""

    def __init__(self, *, wide: bool = False) -> None:
        self._wide = wide
        self._widths = [len(name) for name in _HEADER[:-1]]

    def header(self) -> str:
        return self.line(_HEADER)

    def widen(self, rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
        """The rows' cells, the columns widened to hold them."""
        cells = [self._cells(row) for row in rows]
        if cells:
            columns = zip(*cells, strict=True)
            self._widths = [
                max(w, *map(len, c)) for w, c in zip(self._widths, columns, strict=False)
            ]
        return cells

    def lines(self, rows: list[dict[str, Any]]) -> list[str]:
        return [self.line(cells) for cells in self.widen(rows)]

    def line(self, cells: tuple[str, ...]) -> str:
        widths = self._widths
        room = 1 << 30 if self._wide else max(20, TABLE_COLUMNS - sum(widths) - 2 * len(widths))
        return (
            "  ".join(cell.ljust(w) for cell, w in zip(cells[:-1], widths, strict=True))
            + "  "
            + _cut(cells[-1], room)
        ).rstrip()

    def _cells(self, row: dict[str, Any]) -> tuple[str, ...]:
        # Of the traces its config expects; of those seen when it names no count.
        expected = (
            row["expected_traces"] if row["expected_traces"] is not None else row["samples_seen"]
        )
        sent = "" if row["samples_sent"] is None else f"{row['samples_sent']}/{expected}"
        detail = row["last_error"] or row["reason"] or ""
        if row["missing_traces"]:
            sent += " partial"
            detail = f"PARTIAL: {_missing_text(row)}" + (f"; {detail}" if detail else "")
        wide = self._wide
        cells = (
            short_id(row["run_id"]),
            row["state"],
            sent,
            str(row["set_aside"] or ""),
            holder_text(row["holder"]),
            (row["url"] or row["evaluation_id"] or "")
            if wide
            else (row["evaluation_id"] or "")[:8],
            " ".join(paths.printable(f"{detail}  {row['path']}" if wide else detail).split()),
        )
        return tuple(_CONTROL.sub(_escaped, cell) for cell in cells)


def status_table(
    rows: list[dict[str, Any]], *, ledger: str | Path | None = None, wide: bool = False
) -> str:
    """The runs one a line, fitting TABLE_COLUMNS (`TableLines`), all at once."""
    if not rows:
        return "no runs in the ledger yet" + (f" ({ledger})" if ledger is not None else "")
    table = TableLines(wide=wide)
    cells = table.widen(rows)
    return "\n".join([table.header(), *(table.line(c) for c in cells)])


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters: a run id or a reason holding one (an escape sequence) would drive the
terminal `status` prints to, so the table shows them escaped."""


def _escaped(match: re.Match[str]) -> str:
    return f"\\x{ord(match[0]):02x}"


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def shown_states(states: list[str] | None) -> list[str] | None:
    """The states a run's row is read in for `--state STATES` (a run `uploading` that no live
    process holds is shown `ready`; a followed run is shown `following`): None for every
    state."""
    if not states:
        return None
    stored = [s for s in states if s not in (State.SUPERSEDED, FOLLOWING)]
    if FOLLOWING in states:  # a followed run's row waits, or uploads a stretch
        stored += [s for s in (State.WAITING, State.UPLOADING) if s not in stored]
    if State.READY in stored and State.UPLOADING not in stored:
        stored.append(State.UPLOADING)
    return stored


def selected(
    ledger: Ledger, *, states: list[str] | None, limit: int | None
) -> Iterator[list[RunRecord]]:
    """`status --state S --limit N`'s runs, a page at a time: every run in ledger order; or the
    runs in those states (each state's oldest update first; with `superseded`, the runs that had
    an earlier evaluation, in ledger order); or the N updated last (in those states), in ledger
    order. The rows made of them are then picked by the state they show (`pick`)."""
    stored = shown_states(states)
    if limit is not None:
        newest: list[tuple[int, float]] = []
        for state in stored if stored is not None else [s for s in State if s != State.SUPERSEDED]:
            newest += ledger.newest(state, limit)
        if states and State.SUPERSEDED in states:
            newest += [(r.id, r.updated_at) for page in ledger.pages_with_history() for r in page]
        ids = sorted(row_id for row_id, _ in sorted(newest, key=lambda c: c[1])[-limit:])
        for start in range(0, len(ids), reads.PAGE_RUNS):  # in ledger order, a page at a time
            yield ledger.by_ids(ids[start : start + reads.PAGE_RUNS])
        return
    if stored is None:
        yield from ledger.pages()
        return
    for state in stored:
        yield from ledger.pages_in_state(state)
    if State.SUPERSEDED in (states or ()):
        yield from ledger.pages_with_history()


def pick(rows: list[dict[str, Any]], states: list[str] | None) -> list[dict[str, Any]]:
    """The rows that show one of `states` (all when None or empty)."""
    return [row for row in rows if row["state"] in states] if states else rows


def mark_paused(rows: list[dict[str, Any]], daemon: DaemonRecord | None) -> None:
    """Runs ready or uploading while the running daemon's platform is down say so: they are
    paused by the outage, not stuck."""
    mode = None if daemon is None else daemon.gate.mode
    if mode not in (UNREACHABLE, AUTH, PAUSED):
        return
    why = {
        UNREACHABLE: "platform unreachable",
        AUTH: "API key refused",
        PAUSED: "platform asked to wait",
    }[mode]
    for row in rows:
        if row["state"] in (State.READY, State.UPLOADING):
            row["reason"] = f"paused: {why}; resumes by itself when it answers"
            row["paused"] = True


def daemon_json(running: DaemonRecord | None, last: DaemonRecord | None) -> dict:
    """The daemon for `status --json`: running (its pid, host, when it last wrote, its STATUS
    line and gate), or not (`last_seen`: the pid, host and time it was last seen, and whether
    it stopped cleanly; null when none ever ran here)."""
    if running is not None:
        return {
            "running": True,
            "pid": running.pid,
            "host": running.host,
            "written_at": running.seen_at,
            "status": running.status,
            "gate": msgspec.structs.asdict(running.gate),
        }
    if last is None:
        return {"running": False, "last_seen": None}
    stopped = last.stopped_at is not None
    at = last.stopped_at if stopped else last.seen_at
    seen = {"pid": last.pid, "host": last.host, "at": at, "stopped": stopped}
    return {"running": False, "last_seen": seen}


def fleet_alive(ledger: Ledger, now: float | None = None) -> Alive:
    """`alive_now`, less the holders that are daemons `status` shows as not running (stopped,
    or not heard from): a run is not shown held by a daemon shown gone."""
    alive, now = alive_now(), time.time() if now is None else now
    gone = [d for d in ledger.daemons() if not d.running(now, alive)]
    if not gone:
        return alive
    return lambda holder: alive(holder) and not any(d.holds(holder) for d in gone)


def fleet_rows(ledger: Ledger, now: float | None = None) -> list[dict[str, Any]]:
    """Every daemon the ledger heard from lately (a fleet's hosts): running (its heartbeat not
    three periods late, its process not seen gone), stopped, or not heard from since when; and
    how many runs each holds (the runs whose `holder` it is)."""
    alive = alive_now()
    now = time.time() if now is None else now
    daemons = [(d, d.running(now, alive)) for d in ledger.daemons()]
    holders = (  # the live claims, read only when some daemon may hold one
        [h for r in ledger.claimed() if (h := r.holder) is not None and alive(h)]
        if any(running for _, running in daemons)
        else []
    )
    rows = []
    for d, running in daemons:
        state = "running" if running else ("stopped" if d.stopped_at is not None else "silent")
        rows.append(
            {
                "host": d.host,
                "pid": d.pid,
                "version": d.version,
                "observer": d.observer,
                "started_at": d.started_at,
                "seen_at": d.seen_at,
                "running": running,
                "state": state,
                "stopped_at": d.stopped_at,
                "holds": sum(1 for h in holders if d.holds(h)) if running else 0,
            }
        )
    return rows


def fleet_text(rows: list[dict[str, Any]], now: float | None = None) -> str:
    """`daemons:` and a line per daemon: which run, which stopped or went silent, and when."""
    now = time.time() if now is None else now
    running = sum(row["running"] for row in rows)
    lines = [f"daemons:    {running} running, {len(rows) - running} not (shared ledger)"]
    for row in rows:
        who = f"{row['host']} pid {row['pid']} ({row['version']}; {row['observer'] or '-'})"
        ago = format_duration(max(0.0, now - row["seen_at"]))
        if row["running"]:
            held = row.get("holds", 0)
            state = f"running since {_when(row['started_at'])}, heard from {ago} ago" + (
                f", holds {held} run{'' if held == 1 else 's'}" if held else ""
            )
        elif row["stopped_at"] is not None:
            state = f"stopped at {_when(row['stopped_at'])}"
        else:
            state = f"not heard from since {_when(row['seen_at'])} ({ago} ago): gone?"
        lines.append(f"  {paths.printable(who)}: {state}")
    return "\n".join(lines)


def not_running_text(last: DaemonRecord | None) -> str:
    """`daemon: not running (last seen pid N at T)`: a daemon that stopped or vanished is
    not the same as one that never ran."""
    if last is None:
        return "daemon:     not running (none has run on this state directory)"
    where = "" if last.host == socket.gethostname() else f" on {last.host}"
    seen = daemon_json(None, last)["last_seen"]
    at, how = seen["at"], "stopped" if seen["stopped"] else "gone without stopping (killed?)"
    return f"daemon:     not running (last seen pid {last.pid}{where} at {_when(at)}; {how})"
