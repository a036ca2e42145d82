"""What the local platform keeps: environments, evaluations and samples in SQLite.

In memory (`:memory:`) or in a file. Samples are stored as their JSON bytes, one row each,
duplicates included, so a file database holds gigabytes without Python objects per sample.
Every method is safe to call from any thread (one lock, one connection).
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

RUNNING, COMPLETED = "RUNNING", "COMPLETED"
CLOSE_OUT_STATUSES = frozenset({"FAILED", "CANCELLED"})
_ENCODER, _DECODER = msgspec.json.Encoder(), msgspec.json.Decoder()  # reused: hot per sample

_SCHEMA = """
CREATE TABLE IF NOT EXISTS environments (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    team_id TEXT,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    environment_id TEXT NOT NULL,
    environment_name TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    fields BLOB NOT NULL,
    metadata BLOB NOT NULL,
    metrics BLOB NOT NULL,
    error_message TEXT,
    sample_count INTEGER NOT NULL DEFAULT 0,
    finalize_count INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evaluations_by_environment ON evaluations (environment_name, seq);
CREATE TABLE IF NOT EXISTS samples (
    evaluation_id TEXT NOT NULL,
    sample_id TEXT NOT NULL,
    body BLOB NOT NULL
);
-- SQLite appends the rowid to every index key, so this one also lists samples in arrival order.
CREATE INDEX IF NOT EXISTS samples_by_evaluation ON samples (evaluation_id);
"""


class Refusal(Exception):
    """The platform refuses a request: an HTTP status and a reason."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _object_or_none(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise Refusal(422, f"{key} must be an object")
    return value


def _sample_id(sample: Any, index: int) -> str:
    if not isinstance(sample, dict):
        raise Refusal(422, f"samples[{index}] is not an object")
    sample_id = sample.get("sample_id")
    if sample_id is None or isinstance(sample_id, (bool, dict, list)):
        raise Refusal(422, f"samples[{index}] has no usable sample_id")
    return str(sample_id)


class Store:
    """The local platform's data, with the platform's rules (404, 409, 422) enforced."""

    def __init__(self, db: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(":memory:" if db is None else str(db), check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        # A stand-in needs no fsync: the rollback journal still keeps the file whole if the
        # process dies, and without syncs storing a batch costs ~2 ms per MB instead of ~6.
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.executescript(_SCHEMA)
        # Where each full page listed so far ended: samples are only ever appended, so a page
        # boundary never moves, and listing page after page costs O(n) instead of O(n^2).
        self._page_ends: dict[tuple[str, int, int], int] = {}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- helpers (call with the lock held) ----------------------------------------------------

    def _row(self, evaluation_id: str) -> sqlite3.Row:
        row = self._conn.execute(
            "SELECT * FROM evaluations WHERE id = ?", (evaluation_id,)
        ).fetchone()
        if row is None:
            raise Refusal(404, f"evaluation {evaluation_id} not found")
        return row

    @staticmethod
    def _evaluation(row: sqlite3.Row) -> dict[str, Any]:
        return {
            **_DECODER.decode(row["fields"]),
            "id": row["id"],
            "evaluation_id": row["id"],
            "name": row["name"],
            "status": row["status"],
            "environment_ids": [row["environment_id"]],
            "environment_name": row["environment_name"],
            "metadata": _DECODER.decode(row["metadata"]),
            "metrics": _DECODER.decode(row["metrics"]),
            "error_message": row["error_message"],
            "sample_count": row["sample_count"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
        }

    def _require_running(self, row: sqlite3.Row, action: str) -> None:
        if row["status"] != RUNNING:
            raise Refusal(409, f"cannot {action}: evaluation {row['id']} is {row['status']}")

    # -- the API ----------------------------------------------------------------------------

    def resolve(self, body: Any) -> dict[str, Any]:
        """Get or create an environment by name."""
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise Refusal(422, "name is required")
        with self._lock, self._conn:
            row = self._conn.execute(
                "SELECT id, name FROM environments WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                env_id = f"env_{uuid.uuid4().hex[:16]}"
                self._conn.execute(
                    "INSERT INTO environments VALUES (?, ?, ?, ?)",
                    (env_id, name, body.get("team_id"), _now()),
                )
                return {"id": env_id, "name": name}
            return {"id": row["id"], "name": row["name"]}

    def create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refusal(422, "the body must be a JSON object")
        name, environments = body.get("name"), body.get("environments")
        if not isinstance(name, str) or not name:
            raise Refusal(422, "name is required")
        if (
            not isinstance(environments, list)
            or not environments
            or not isinstance(environments[0], dict)
        ):
            raise Refusal(422, "environments must be a non-empty list of {id}")
        metadata, metrics = _object_or_none(body, "metadata"), _object_or_none(body, "metrics")
        fields = {
            k: v
            for k, v in body.items()
            if k not in ("name", "environments", "metadata", "metrics")
        }
        evaluation_id = str(uuid.uuid4())
        with self._lock, self._conn:
            env = self._conn.execute(
                "SELECT id, name FROM environments WHERE id = ?", (environments[0].get("id"),)
            ).fetchone()
            if env is None:
                raise Refusal(422, f"unknown environment id {environments[0].get('id')!r}")
            now = _now()
            self._conn.execute(
                "INSERT INTO evaluations (id, environment_id, environment_name, name, status, fields,"
                " metadata, metrics, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    evaluation_id,
                    env["id"],
                    env["name"],
                    name,
                    RUNNING,
                    _ENCODER.encode(fields),
                    _ENCODER.encode(metadata or {}),
                    _ENCODER.encode(metrics or {}),
                    now,
                    now,
                ),
            )
            return self._evaluation(self._row(evaluation_id))

    def add_samples(self, evaluation_id: str, body: Any) -> dict[str, Any]:
        """Append a batch as it came, duplicates included; all or nothing."""
        samples = body.get("samples") if isinstance(body, dict) else None
        if not isinstance(samples, list):
            raise Refusal(422, 'the body must be {"samples": [...]}')
        # A generator, so no second copy of a 25 MiB batch is held; a bad sample rolls back.
        rows = (
            (evaluation_id, _sample_id(s, i), _ENCODER.encode(s)) for i, s in enumerate(samples)
        )
        with self._lock, self._conn:
            self._require_running(self._row(evaluation_id), "add samples")
            self._conn.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)
            self._conn.execute(
                "UPDATE evaluations SET sample_count = sample_count + ?, updated_at = ?"
                " WHERE id = ?",
                (len(samples), _now(), evaluation_id),
            )
            total = self._row(evaluation_id)["sample_count"]
        return {"accepted": len(samples), "sample_count": total}

    def finalize(self, evaluation_id: str, body: Any) -> dict[str, Any]:
        """Mark COMPLETED with the final metrics; every request is counted, refused ones too."""
        metrics = _object_or_none(body, "metrics") if isinstance(body, dict) else None
        with self._lock:
            with self._conn:
                self._row(evaluation_id)
                self._conn.execute(
                    "UPDATE evaluations SET finalize_count = finalize_count + 1 WHERE id = ?",
                    (evaluation_id,),
                )
            with self._conn:
                row = self._row(evaluation_id)
                self._require_running(row, "finalize")
                self._conn.execute(
                    "UPDATE evaluations SET status = ?, metrics = ?, updated_at = ? WHERE id = ?",
                    (
                        COMPLETED,
                        _ENCODER.encode(metrics) if metrics is not None else row["metrics"],
                        _now(),
                        evaluation_id,
                    ),
                )
                return self._evaluation(self._row(evaluation_id))

    def close_out(self, evaluation_id: str, body: Any) -> dict[str, Any]:
        status = body.get("status") if isinstance(body, dict) else None
        if not isinstance(status, str) or status.upper() not in CLOSE_OUT_STATUSES:
            raise Refusal(422, f"status must be one of {', '.join(sorted(CLOSE_OUT_STATUSES))}")
        metadata, metrics = _object_or_none(body, "metadata"), _object_or_none(body, "metrics")
        with self._lock, self._conn:
            row = self._row(evaluation_id)
            self._require_running(row, "close out")
            self._conn.execute(
                "UPDATE evaluations SET status = ?, error_message = ?, metadata = ?, metrics = ?,"
                " updated_at = ? WHERE id = ?",
                (
                    status.upper(),
                    body.get("error_message"),
                    _ENCODER.encode(metadata) if metadata is not None else row["metadata"],
                    _ENCODER.encode(metrics) if metrics is not None else row["metrics"],
                    _now(),
                    evaluation_id,
                ),
            )
            return self._evaluation(self._row(evaluation_id))

    def get(self, evaluation_id: str) -> dict[str, Any]:
        with self._lock:
            return self._evaluation(self._row(evaluation_id))

    def list_samples(self, evaluation_id: str, page: int, limit: int) -> dict[str, Any]:
        """One page (1-based) of samples in arrival order; each sample as the JSON it came as."""
        with self._lock:
            total = self._row(evaluation_id)["sample_count"]
            after = self._page_ends.get((evaluation_id, limit, page - 1))
            if after is None:
                query = "WHERE evaluation_id = ? ORDER BY rowid LIMIT ? OFFSET ?"
                args: tuple[Any, ...] = (evaluation_id, limit, (page - 1) * limit)
            else:
                query = "WHERE evaluation_id = ? AND rowid > ? ORDER BY rowid LIMIT ?"
                args = (evaluation_id, after, limit)
            rows = self._conn.execute(f"SELECT rowid, body FROM samples {query}", args).fetchall()
            if len(rows) == limit:
                self._page_ends[(evaluation_id, limit, page)] = rows[-1]["rowid"]
        return {
            "samples": [msgspec.Raw(row["body"]) for row in rows],
            "page": page,
            "limit": limit,
            "total": total,
            "total_pages": -(-total // limit),
        }

    def list_evaluations(
        self, environment_name: str | None, skip: int, limit: int
    ) -> dict[str, Any]:
        where, args = (
            ("WHERE environment_name = ?", [environment_name]) if environment_name else ("", [])
        )
        with self._lock:
            total = self._conn.execute(
                f"SELECT COUNT(*) FROM evaluations {where}", args
            ).fetchone()[0]
            rows = self._conn.execute(
                f"SELECT * FROM evaluations {where} ORDER BY seq LIMIT ? OFFSET ?",
                [*args, limit, skip],
            ).fetchall()
            return {
                "evaluations": [self._evaluation(r) for r in rows],
                "total": total,
                "skip": skip,
                "limit": limit,
            }

    # -- for tests ----------------------------------------------------------------------------

    def samples(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Every stored sample of an evaluation, duplicates included, in arrival order."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT body FROM samples WHERE evaluation_id = ? ORDER BY rowid", (evaluation_id,)
            ).fetchall()
        return [_DECODER.decode(row["body"]) for row in rows]

    def summary(self) -> dict[str, Any]:
        """Per evaluation what was received, and how many evaluations each run_id got."""
        with self._lock:
            distinct = dict(
                self._conn.execute(
                    "SELECT evaluation_id, COUNT(DISTINCT sample_id) FROM samples GROUP BY evaluation_id"
                ).fetchall()
            )
            rows = self._conn.execute("SELECT * FROM evaluations ORDER BY seq").fetchall()
        evaluations: dict[str, Any] = {}
        runs: dict[str, int] = {}
        for row in rows:
            metadata = _DECODER.decode(row["metadata"])
            unique = distinct.get(row["id"], 0)
            evaluations[row["id"]] = {
                "name": row["name"],
                "environment": row["environment_name"],
                "status": row["status"],
                "metadata": metadata,
                "metrics": _DECODER.decode(row["metrics"]),
                "sample_count": row["sample_count"],
                "distinct_sample_ids": unique,
                "duplicates": row["sample_count"] - unique,
                "finalize_count": row["finalize_count"],
            }
            run_id = metadata.get("run_id")
            if run_id is not None:
                runs[str(run_id)] = runs.get(str(run_id), 0) + 1
        return {"evaluations": evaluations, "runs": runs}
