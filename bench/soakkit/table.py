"""The soak's table: what was written, what the platform holds, what the world did to it."""

from __future__ import annotations

from collections import Counter

from soakkit.plan import Flaw
from soakkit.run import SoakReport
from soakkit.uploaders import Mode


def _counts(counter: Counter) -> str:
    return ", ".join(f"{key}: {n}" for key, n in sorted(counter.items(), key=str)) or "none"


def table(report: SoakReport) -> str:
    runs = report.accounting.runs
    uploading = [r for r in runs if r.plan.flaw.uploads]
    cannot = [r for r in runs if not r.plan.flaw.uploads]
    plans = report.plans
    readiness = Counter(p.readiness.value for p in plans)
    flaws = Counter(p.flaw.value for p in plans if p.flaw != Flaw.NONE)
    rewritten = sum(1 for p in plans if p.rewrite_at is not None)
    finalize = Counter(n for r in runs for n in r.finalize_calls)
    metrics_equal = sum(1 for r in uploading if r.metrics_equal)
    samples_equal = sum(1 for r in uploading if r.samples_equal)
    faults = report.faults
    p = report.params
    rows = [
        ("mode", f"{p.mode}, seed {p.seed}, {p.writers} writers, workdir {p.workdir}"),
        (
            "runs",
            f"{len(runs)} (ready by {_counts(readiness)}; flawed {_counts(flaws)}; "
            f"{rewritten} rewritten mid-way)",
        ),
        ("samples written", f"{report.accounting.total('samples_written'):,} good lines"),
        (
            "evaluations per run",
            f"uploading runs: {_counts(Counter(r.shape for r in uploading))}; "
            f"runs that cannot upload: {_counts(Counter(r.shape for r in cannot))}",
        ),
        ("samples lost", f"{report.accounting.total('lost')}"),
        ("samples duplicated", f"{report.accounting.total('duplicated')}"),
        ("samples never written", f"{report.accounting.total('unexpected')}"),
        ("finalize calls per evaluation", _counts(finalize)),
        ("metrics equal to convert", f"{metrics_equal}/{len(uploading)} runs"),
        ("samples equal to convert", f"{samples_equal}/{len(uploading)} runs"),
        (
            "ledger at the end",
            f"{_counts(report.ledger.states)} (`evalpush status`; "
            f"{len(report.ledger.problems)} disagree with the platform)",
        ),
        (
            "kills (SIGKILL)",
            f"{report.kills} of {report.uploader_starts} uploader starts; "
            f"other exits {_counts(report.uploader_exits)}",
        ),
        ("outages", f"{report.outages} ({report.outage_seconds:.1f} s refused in all)"),
        (
            "faults injected",
            f"{sum(faults.values())} ({_counts(faults)}); {report.faults_left_pending} "
            "never met by a request",
        ),
        (
            "overlapping pushes",
            f"{report.overlaps} ({report.overlap_kills} SIGKILLed; other exits "
            f"{_counts(report.overlap_exits)}; {report.overlap_timeouts} timed out)",
        ),
        (
            "wall time",
            f"{report.wall_seconds:.1f} s (chaos {report.chaos_seconds:.1f}"
            f"{', TIMED OUT' if report.chaos_timed_out else ''}, drain "
            f"{report.drain_seconds:.1f}, accounting {report.account_seconds:.1f})",
        ),
        (
            "API key found in",
            ", ".join(report.secret_found_in)
            or "nothing (every log, the ledger, the platform's stored evaluations searched)",
        ),
        ("tracebacks in", ", ".join(report.tracebacks_in) or "no log"),
    ]
    if p.mode == Mode.DAEMON:
        rows.append(("daemon exit on SIGTERM", str(report.daemon_stop_exit)))
    if report.fleet is not None:
        spread = ", ".join(f"{h}: {n}" for h, n in sorted(report.fleet.runs_per_daemon.items()))
        rows.append(
            (
                "fleet",
                f"{report.fleet.daemons} daemons in PID namespaces of their own, one PostgreSQL "
                f"ledger, restarted {report.fleet.db_restarts} times (-m immediate); runs "
                f"finalized per daemon: {spread}",
            )
        )
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    violations = report.violations
    lines.append(f"{'VIOLATIONS':<{width}}  {len(violations)}")
    lines += [f"  - {v}" for v in violations]
    return "\n".join(lines)
