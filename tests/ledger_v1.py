"""The schema-1 ledger fixture (`tests/fixtures/ledger_v1/`, written by schema-1 evalpush; see
tools/make_ledger_v1.py), rebuilt as a real SQLite file for a test.

`build(state_dir, root)` writes `state_dir/state.db` from its SQL, its runs' paths under `root`
(where `copy_runs(root)` puts the run directories), in WAL mode as schema-1 evalpush left it.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ledger_v1"
RUN_IDS = {
    "finalized": "11111111-1111-4111-8111-111111111111",
    "superseded": "22222222-2222-4222-8222-222222222222",
    "interrupted": "33333333-3333-4333-8333-333333333333",
    "moved": "44444444-4444-4444-8444-444444444444",
    "held": "55555555-5555-4555-8555-555555555555",
    "failed": "66666666-6666-4666-8666-666666666666",
}
ROWS = 8  # one per run, and a second row for the run seen at two paths
RUNS = 7


def build(state_dir: Path, root: Path) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / "state.db"
    sql = (FIXTURE / "state.sql").read_text().replace("@ROOT@", str(root))
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(sql)
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    path.chmod(0o600)
    return path


def copy_runs(root: Path) -> Path:
    shutil.copytree(FIXTURE / "runs", root, dirs_exist_ok=True)
    return root / "outputs"
