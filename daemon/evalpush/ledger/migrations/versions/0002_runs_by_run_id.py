"""Schema 2: runs keyed by run id, with the path they were last seen at (as text for people and
as the raw bytes), the trace file's fingerprint, whether the platform was searched for the run
id, and the run's claim; `forgotten` evaluations.

A run that schema 1 saw at two paths had two rows: the one updated last is kept, and the other's
evaluation goes to its history as `duplicate`. (SQLite only: a shared ledger began at 6.)
"""

from alembic import op

revision = "0002"
down_revision = "0001"

_V1_COLUMNS = (
    "id, run_id, path, kind, state, reason, step, file_device, file_inode, file_size, "
    "upload_end, env_id, evaluation_id, viewer_url, pending, acked_offset, acked_line, "
    "samples_sent, samples_seen, bytes_sent, totals, release_hold, attempts, last_error, "
    "created_at, updated_at, finalized_at"
)


def upgrade() -> None:
    op.execute("""
    CREATE TABLE runs_v2 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        path TEXT NOT NULL,
        path_raw BLOB NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        step TEXT NOT NULL DEFAULT 'scan',
        file_device INTEGER,
        file_inode INTEGER,
        file_size INTEGER,
        file_mtime_ns INTEGER,
        file_ctime_ns INTEGER,
        file_digest BLOB,
        upload_end INTEGER,
        env_id TEXT,
        evaluation_id TEXT,
        viewer_url TEXT,
        pending TEXT,
        acked_offset INTEGER NOT NULL DEFAULT 0,
        acked_line INTEGER NOT NULL DEFAULT 0,
        samples_sent INTEGER NOT NULL DEFAULT 0,
        samples_seen INTEGER NOT NULL DEFAULT 0,
        bytes_sent INTEGER NOT NULL DEFAULT 0,
        totals BLOB,
        release_hold INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        looked_up INTEGER NOT NULL DEFAULT 0,
        claim_owner TEXT,
        claim_host TEXT,
        claim_boot TEXT,
        claim_pid INTEGER,
        claim_start INTEGER,
        claim_pidns TEXT,
        claim_since REAL,
        claim_expires REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finalized_at REAL
    )""")
    op.execute(f"""
    INSERT INTO runs_v2 ({_V1_COLUMNS}, path_raw, looked_up)
    SELECT {_V1_COLUMNS}, CAST(path AS BLOB), 1 FROM runs AS r
    WHERE NOT EXISTS (
        SELECT 1 FROM runs AS later WHERE later.run_id = r.run_id
        AND (later.updated_at > r.updated_at OR (later.updated_at = r.updated_at AND later.id > r.id))
    )""")
    op.execute("""
    INSERT OR IGNORE INTO history (run, evaluation_id, viewer_url, outcome, at)
    SELECT kept.id, h.evaluation_id, h.viewer_url, h.outcome, h.at
    FROM history AS h JOIN runs AS dup ON dup.id = h.run JOIN runs_v2 AS kept USING (run_id)
    WHERE dup.id != kept.id""")
    op.execute("""
    INSERT OR IGNORE INTO history (run, evaluation_id, viewer_url, outcome, at)
    SELECT kept.id, dup.evaluation_id, dup.viewer_url, 'duplicate', dup.updated_at
    FROM runs AS dup JOIN runs_v2 AS kept USING (run_id)
    WHERE dup.id != kept.id AND dup.evaluation_id IS NOT NULL""")
    op.execute("DELETE FROM history WHERE run NOT IN (SELECT id FROM runs_v2)")
    op.execute("DELETE FROM set_aside WHERE run NOT IN (SELECT id FROM runs_v2)")
    op.execute("DROP TABLE runs")
    op.execute("ALTER TABLE runs_v2 RENAME TO runs")
    op.execute("CREATE INDEX runs_path_raw ON runs (path_raw)")
    op.execute("""
    CREATE TABLE forgotten (
        run_id TEXT NOT NULL,
        evaluation_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_id, evaluation_id)
    )""")
