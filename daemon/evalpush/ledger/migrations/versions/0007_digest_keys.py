"""Schema 7: a run id and a path of any characters and any length. Runs are found by fixed-size
digests (`run_key`: SHA-256 of the run id, unique; `path_key`: SHA-256 of `path_raw`), the
values themselves kept whole in columns no index holds (a PostgreSQL btree refuses an entry over
2,704 bytes: a long run id or path stopped every daemon of a fleet). A run id that holds a NUL,
or starts with `evalpush-hex:`, is stored in hex (`tables.stored_run_id`). `forgotten` is keyed
by `run_key` too."""

from alembic import op

from evalpush.ledger.tables import path_key, run_key, stored_run_id

revision = "0007"
down_revision = "0006"

_RUNS_V7_COLUMNS = (
    "id, run_id, path, path_raw, kind, state, reason, step, file_device, file_inode, file_size, "
    "file_mtime_ns, file_ctime_ns, file_digest, upload_end, env_id, evaluation_id, viewer_url, "
    "pending, acked_offset, acked_line, samples_sent, samples_seen, bytes_sent, totals, "
    "release_hold, attempts, last_error, looked_up, claim_owner, claim_host, claim_boot, "
    "claim_pid, claim_start, claim_pidns, claim_since, claim_expires, created_at, updated_at, "
    "finalized_at, settles_at, last_error_at"
)

# A run id PostgreSQL held before this version (it held no NUL), as `stored_run_id` stores it.
_PG_STORED_RUN_ID = (
    "CASE WHEN run_id LIKE 'evalpush-hex:%' "
    "THEN 'evalpush-hex:' || encode(convert_to(run_id, 'UTF8'), 'hex') ELSE run_id END"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _sqlite()
    else:
        _postgresql()


def _sqlite() -> None:
    # SQLite keeps a constraint in its table's definition: the table is rebuilt (the unique
    # index on run_id and the index on path_raw go), its digests computed by these functions.
    db = op.get_bind().connection.driver_connection
    db.create_function("evalpush_run_key", 1, run_key, deterministic=True)
    db.create_function("evalpush_path_key", 1, path_key, deterministic=True)
    db.create_function("evalpush_stored_run_id", 1, stored_run_id, deterministic=True)
    op.execute("""
    CREATE TABLE runs_v7 (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
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
        finalized_at REAL,
        settles_at REAL,
        last_error_at REAL,
        run_key BLOB NOT NULL UNIQUE,
        path_key BLOB NOT NULL
    )""")
    stored = _RUNS_V7_COLUMNS.replace("id, run_id,", "id, evalpush_stored_run_id(run_id),", 1)
    op.execute(f"""
    INSERT INTO runs_v7 ({_RUNS_V7_COLUMNS}, run_key, path_key)
    SELECT {stored}, evalpush_run_key(run_id), evalpush_path_key(path_raw)
    FROM runs""")
    op.execute("DROP TABLE runs")
    op.execute("ALTER TABLE runs_v7 RENAME TO runs")
    op.execute("CREATE INDEX runs_path_key ON runs (path_key)")
    op.execute("CREATE INDEX runs_state ON runs (state)")
    op.execute("""
    CREATE TABLE forgotten_v7 (
        run_key BLOB NOT NULL,
        run_id TEXT NOT NULL,
        evaluation_id TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (run_key, evaluation_id)
    )""")
    op.execute("""
    INSERT INTO forgotten_v7 (run_key, run_id, evaluation_id, at)
    SELECT evalpush_run_key(run_id), evalpush_stored_run_id(run_id), evaluation_id, at
    FROM forgotten""")
    op.execute("DROP TABLE forgotten")
    op.execute("ALTER TABLE forgotten_v7 RENAME TO forgotten")


def _postgresql() -> None:
    op.execute("ALTER TABLE runs ADD COLUMN run_key bytea, ADD COLUMN path_key bytea")
    op.execute(
        "UPDATE runs SET run_key = sha256(convert_to(run_id, 'UTF8')), "
        f"path_key = sha256(path_raw), run_id = {_PG_STORED_RUN_ID}"
    )
    op.execute(
        "ALTER TABLE runs ALTER COLUMN run_key SET NOT NULL, ALTER COLUMN path_key SET NOT NULL"
    )
    op.execute("ALTER TABLE runs DROP CONSTRAINT runs_run_id_key")
    op.execute("DROP INDEX runs_path_raw")
    op.execute("CREATE UNIQUE INDEX runs_run_key ON runs (run_key)")
    op.execute("CREATE INDEX runs_path_key ON runs (path_key)")
    op.execute("ALTER TABLE forgotten ADD COLUMN run_key bytea")
    op.execute(
        "UPDATE forgotten SET run_key = sha256(convert_to(run_id, 'UTF8')), "
        f"run_id = {_PG_STORED_RUN_ID}"
    )
    op.execute("ALTER TABLE forgotten ALTER COLUMN run_key SET NOT NULL")
    op.execute("ALTER TABLE forgotten DROP CONSTRAINT forgotten_pkey")
    op.execute("ALTER TABLE forgotten ADD PRIMARY KEY (run_key, evaluation_id)")
