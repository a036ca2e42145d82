"""Partial uploads are loud, through a real daemon and the local platform: a crashed eval's run
(fewer traces than expected, a bad line) warns, is uploaded with `complete: false` in the one
`evalpush` metadata key, and once the rest arrives the new evaluation names the one it
supersedes, which is marked on the platform; `runs.on_incomplete = "hold"` keeps it back for a
person instead. The viewer pages show both markers (headless chromium, where it runs)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from browser import Chromium, Page, chromium, why_chromium_cannot_run
from daemon_support import (
    InProcessDaemon,
    RunDir,
    daemon_environ,
    evaluations_of,
    status,
    wait_until,
)
from evalpush import __version__
from evalpush.local_platform import LocalPlatform
from support.commands import evalpush

EXPECTED = 8  # num_tasks 4 x 2 rollouts
WRITTEN = 5  # the eval crashed after these


def crashed_run(tree: Path) -> RunDir:
    """A run whose eval wrote WRITTEN of EXPECTED traces, one of them a bad line, and died."""
    run = RunDir(tree / "gsm8k--org--model").config(num_tasks=EXPECTED // 2)
    lines = run.lines(WRITTEN - 1)
    run.write([lines[0], b'{"id": "broken", "task": ', *lines[1:]])
    return run


def test_a_crashed_evals_run_warns_uploads_as_partial_and_the_rest_supersedes_it_marked(
    local_platform: LocalPlatform, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree])
    run = crashed_run(tree)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        short = daemon.wait_for(
            "run finished short of its expected traces: uploading it as a partial evaluation",
            run=run.run_id,
        )
        first = daemon.wait_for("run finalized", run=run.run_id)
        (partial_id,) = evaluations_of(local_platform, run.run_id)

        run.write(run.lines(EXPECTED - WRITTEN + 1, start=WRITTEN - 1))  # the eval resumed
        second = daemon.wait_for("run finalized", run=run.run_id, count=2)
        marked = daemon.wait_for("superseded evaluation marked on the platform", run=run.run_id)
        assert daemon.stop() == 0

    assert (
        short["level"] == "warning" and short["why"] == f"{WRITTEN} of {EXPECTED} expected traces"
    )
    assert (first["level"], first["set_aside"], first["complete"]) == ("warning", 1, False)
    assert (first["seen_traces"], first["expected_traces"]) == (WRITTEN, EXPECTED)
    assert (second["level"], second["set_aside"]) == ("warning", 1), "the bad line is still bad"
    evaluations = evaluations_of(local_platform, run.run_id)
    (complete_id,) = set(evaluations) - {partial_id}
    partial = evaluations[partial_id]["metadata"]["evalpush"]
    assert partial == {
        "version": __version__,
        "host": socket.gethostname(),
        "expected_traces": EXPECTED,
        "seen_traces": WRITTEN,
        "set_aside": 1,
        "complete": False,
        "supersedes": None,
        "superseded_by": complete_id,
    }
    replacing = evaluations[complete_id]["metadata"]["evalpush"]
    assert replacing["supersedes"] == partial_id and replacing["seen_traces"] == EXPECTED + 1
    assert marked["evaluation"] == partial_id and marked["superseded_by"] == complete_id
    assert evaluations[partial_id]["status"] == "COMPLETED", "the mark changes no status"
    other_keys = set(evaluations[complete_id]["metadata"]) - {"evalpush"}
    assert "run_id" in other_keys and not any(k.startswith("evalpush") for k in other_keys)

    show_markers(local_platform, partial_id, complete_id, tmp_path, request)


def show_markers(
    platform: LocalPlatform,
    partial_id: str,
    complete_id: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The partial, superseded evaluation's page and the list, as a browser shows them."""
    page_url = f"{platform.base_url}/dashboard/evaluations/{partial_id}"
    why = why_chromium_cannot_run()
    if why is not None:
        import httpx

        html = httpx.get(page_url, timeout=30).text
        page = Page(html)
        assert "PARTIAL" in page.text and "SUPERSEDED" in page.text
        pytest.skip(f"markers checked in the HTML only: {why}")
    browser: Chromium = chromium(tmp_path / "profiles")
    page = Page(browser.dump_dom(page_url))
    text = page.text
    assert "PARTIAL" in text and "SUPERSEDED" in text
    assert f"Partial upload: {WRITTEN} of {EXPECTED} expected traces, 1 set aside." in text
    assert f"Superseded by evaluation {complete_id}" in text
    list_url = f"{platform.base_url}/dashboard/evaluations"
    listing = Page(browser.dump_dom(list_url)).text
    # both are partial (the bad line is still set aside); only the first is superseded
    assert listing.count("PARTIAL") == 2 and listing.count("SUPERSEDED") == 1
    keep: Path | None = request.config.getoption("--viewer-screenshot")
    for name, url in (("viewer-partial.png", page_url), ("viewer-list.png", list_url)):
        out = (keep.parent / name) if keep else tmp_path / name
        browser.screenshot(url, out, width=1280, height=900)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_on_incomplete_hold_keeps_the_run_back_until_retry_uploads_it_as_it_is(
    local_platform: LocalPlatform, tmp_path: Path
) -> None:
    tree = tmp_path / "outputs"
    environ = daemon_environ(local_platform, tmp_path, [tree], EVALPUSH_RUNS__ON_INCOMPLETE="hold")
    run = crashed_run(tree)
    with InProcessDaemon(environ) as daemon:
        daemon.started()
        held = daemon.wait_for(
            "run finished short of its expected traces: held for a person", run=run.run_id
        )
        row = wait_until(
            lambda: (r := status(environ).get(run.run_id)) and r["state"] == "held" and r,
            "the run to be held",
        )
        assert evaluations_of(local_platform, run.run_id) == {}

        retried = evalpush(environ, "retry", run.run_id[:8])
        finalized = daemon.wait_for("run finalized", run=run.run_id)
        assert daemon.stop() == 0

    assert held["level"] == "warning" and held["on_incomplete"] == "hold"
    assert row["reason"].startswith(f"incomplete: {WRITTEN} of {EXPECTED} expected traces")
    assert f"`evalpush retry {run.run_id[:8]}` uploads it as it is" in row["reason"]
    assert retried.returncode == 0, retried.stderr
    assert finalized["complete"] is False
    (evaluation,) = evaluations_of(local_platform, run.run_id).values()
    assert evaluation["metadata"]["evalpush"]["complete"] is False
