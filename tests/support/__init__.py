"""Test helpers in one importable place (tests/ is on the path: `from support.runs import ...`).

- `support.runs`: trace lines, config.toml text, run directories, trace-file edits.
- `support.environ`: hermetic environments for `python -m evalpush` subprocesses.
- `support.commands`: `evalpush ...` run or started as a subprocess, `status --json`.
- `support.producer`: bench/gen_traces.py, the producer-shaped run generator.
- `support.platform_view`: what the local platform holds (a run's evaluations, request counts).
- `support.waiting`: `wait_until(condition, what)`, bounded.
- `support.files`: byte-level file writes, a directory every user may enter.
- `support.threads`: the check behind conftest.py's thread-leak guards.

Built on these (names kept for the tests that import them): `pushing` (`push` subprocesses and
the exactly-once check), `daemon_support` (`evalpush run` subprocesses, `RunDir`), `demo_push`,
`disks`, `as_nobody`, `browser`, `ledger_v1`, `inotify_limited`. Fixtures are in conftest.py.
"""

import pytest

# Assertions in the helpers are rewritten as a test's are, so a failing one shows its values (a
# helper module imported before this line could not be: conftest.py imports this package first).
pytest.register_assert_rewrite(
    "support.commands",
    "support.producer",
    "pushing",
    "daemon_support",
    "demo_push",
)
