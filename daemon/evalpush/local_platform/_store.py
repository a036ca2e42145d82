"""What the local platform keeps: environments, evaluations and samples in SQLite.

In memory (`:memory:`) or in a file. Samples are stored as their JSON bytes, one row each,
duplicates included, so a file database holds gigabytes without Python objects per sample.
Every method is safe to call from any thread (one lock, one connection).

A samples batch is never turned into Python objects: `decode_samples` checks the body is UTF-8
and splits `{"samples": [...]}` into each sample's raw JSON (msgspec, in C), `_sample_keys` reads
only the `sample_id` and `reward` of each, and the raw bytes are stored as they came. That costs
about a quarter of decoding every sample and encoding it again (~4-6 ms of CPU per MB instead of
~16-24). The reward also goes in a column of its own, for the viewer's averages and histogram:
reading it in the same pass costs ~1.3 us a sample (the platform's CPU for bench/push.py's 72 MB
push stayed 0.42 s), where reading it from the stored JSON costs ~230 ms per view of 20,000.
"""

from __future__ import annotations

import codecs
import sqlite3
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from evalpush.core.errors import ConfigError

RUNNING, COMPLETED = "RUNNING", "COMPLETED"
CLOSE_OUT_STATUSES = frozenset({"FAILED", "CANCELLED"})
_ENCODER, _DECODER = msgspec.json.Encoder(), msgspec.json.Decoder()
# 16 KiB pages hold several samples of a few KB each instead of one per 4 KiB page: inserting a
# batch costs ~1.3-1.6 ms per MB instead of ~1.9-2.4. Only a new database takes it (an existing
# file keeps its page size).
PAGE_SIZE = 16384
UTF8_CHUNK = 64 * 1024  # UTF-8 is checked chunk by chunk: no str of a whole 25 MiB body
SAMPLES_SHAPE = 'the body must be {"samples": [...]}'


class _SamplesBody(msgspec.Struct):
    """A samples body, each sample kept as its raw JSON (checked to be JSON, not decoded)."""

    samples: list[msgspec.Raw]


class _SampleKeys(msgspec.Struct):
    """A sample's `sample_id` and raw `reward`, every other key skipped.

    The reward stays raw: a sample is stored whatever its reward is (a string, `1e400`, absent).
    """

    sample_id: str | int | float
    reward: msgspec.Raw = msgspec.Raw(b"null")


_SAMPLES_DECODER = msgspec.json.Decoder(_SamplesBody)
_SAMPLE_KEYS_DECODER = msgspec.json.Decoder(_SampleKeys)

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
    body BLOB NOT NULL,
    reward REAL  -- the sample's numeric `reward`, NULL when it has none
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


def decode_json(body: bytes | bytearray) -> Any:
    """A request body as Python objects (None when empty); 422 when it is not JSON."""
    try:
        return _DECODER.decode(body) if body else None
    except msgspec.DecodeError as exc:
        raise Refusal(422, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refusal(422, "the body is not JSON: nested too deeply") from None


def _check_utf8(body: bytes | bytearray) -> None:
    """422 unless `body` is UTF-8: msgspec does not look inside the raw samples it skips."""
    if body.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    for start in range(0, len(view), UTF8_CHUNK):
        try:
            decoder.decode(view[start : start + UTF8_CHUNK], final=start + UTF8_CHUNK >= len(view))
        except UnicodeDecodeError as exc:
            raise Refusal(
                422, f"the body is not JSON: invalid UTF-8 near byte {start + exc.start}"
            ) from None


def decode_samples(body: bytes | bytearray) -> list[msgspec.Raw]:
    """Each sample of a `{"samples": [...]}` body as its raw JSON; 422 like `decode_json` else.

    Refuses what decoding the whole body would (not UTF-8, not JSON, nested too deeply), except
    a number beyond a float's range (`1e400`) inside a sample, which is stored as sent.
    """
    if not body:
        raise Refusal(422, SAMPLES_SHAPE)
    _check_utf8(body)
    try:
        return _SAMPLES_DECODER.decode(body).samples
    except msgspec.ValidationError:
        pass  # JSON of another shape, or a shape error met before a syntax error: which?
    except msgspec.DecodeError as exc:
        raise Refusal(422, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise Refusal(422, "the body is not JSON: nested too deeply") from None
    decode_json(body)  # a refused body only: say "not JSON" if it is not
    raise Refusal(422, SAMPLES_SHAPE)


def _reward(raw: msgspec.Raw | bytes) -> float | None:
    """A raw JSON `reward` as a float (`1e400` as infinity); None when it is not a number."""
    try:
        return float(bytes(raw))  # JSON's literals and strings are not floats; numbers all are
    except ValueError:
        return None


def _sample_keys(sample: msgspec.Raw, index: int) -> tuple[str, float | None]:
    """The sample's `sample_id` as text (a number's as `str` gives it) and its numeric reward;
    422 without a sample_id."""
    try:
        keys = _SAMPLE_KEYS_DECODER.decode(sample)
        return str(keys.sample_id), _reward(keys.reward)
    except (msgspec.DecodeError, RecursionError):
        pass
    # A refused batch only: decode the sample to say why, as the checks on objects did.
    try:
        value = _DECODER.decode(sample)
    except msgspec.DecodeError as exc:  # e.g. a sample_id of 1e400, out of a float's range
        raise Refusal(422, f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Refusal(422, f"samples[{index}] is not an object")
    raise Refusal(422, f"samples[{index}] has no usable sample_id")


def _unusable(db: Path | None, exc: sqlite3.Error) -> str:
    """Why the database file cannot be used, and what it needs."""
    return (
        f"local platform: cannot use {db} as its database ({exc}): the file and its directory "
        "must be writable (SQLite keeps a write-ahead log beside the file)"
    )


class Store:
    """The local platform's data, with the platform's rules (404, 409, 422) enforced."""

    def __init__(self, db: Path | None = None) -> None:
        self._lock = threading.Lock()
        try:
            self._conn = sqlite3.connect(
                ":memory:" if db is None else str(db), check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise ConfigError(_unusable(db, exc)) from None
        try:
            self._set_up(db)
        except sqlite3.Error as exc:
            self._conn.close()
            raise ConfigError(_unusable(db, exc)) from None
        # Where each full page listed so far ended: samples are only ever appended, so a page
        # boundary never moves, and listing page after page costs O(n) instead of O(n^2).
        self._page_ends: dict[tuple[str, int, int], int] = {}

    def _set_up(self, db: Path | None) -> None:
        self._conn.row_factory = sqlite3.Row
        # A stand-in needs no fsync: the write-ahead log still keeps the file whole if the
        # process dies, and without syncs storing a batch costs ~2 ms per MB instead of ~6.
        # The log, not a rollback journal: a journal is a file created and deleted at every
        # write, which made a one-trace run's calls (create, read, one sample, finalize) cost
        # the store 1.26 ms of CPU against 0.3 (0.75 ms of it system time).
        self._conn.execute("PRAGMA synchronous=OFF")
        self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before the log: WAL fixes it
        if db is not None:
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        self._add_reward_column()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _add_reward_column(self) -> None:
        """Give a database file written before samples had a `reward` column one, filled in."""
        columns = {row["name"] for row in self._conn.execute("PRAGMA table_info(samples)")}
        if "reward" in columns:
            return
        with self._conn:
            self._conn.execute("ALTER TABLE samples ADD COLUMN reward REAL")
            rows = self._conn.execute("SELECT rowid, body FROM samples").fetchall()
            self._conn.executemany(
                "UPDATE samples SET reward = ? WHERE rowid = ?",
                ((_sample_keys(row["body"], 0)[1], row["rowid"]) for row in rows),
            )

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
            # What the `prime` CLI reads: `eval list` shows environment_names[0] and is_hosted as
            # its Environment and Type columns; prime_evals' Evaluation model has total_samples.
            "environment_names": [row["environment_name"]],
            "is_hosted": False,
            "metadata": _DECODER.decode(row["metadata"]),
            "metrics": _DECODER.decode(row["metrics"]),
            "error_message": row["error_message"],
            "sample_count": row["sample_count"],
            "total_samples": row["sample_count"],
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

    def add_samples(self, evaluation_id: str, body: bytes | bytearray) -> dict[str, Any]:
        """Append a batch (the request body) as it came, duplicates included; all or nothing.

        Each sample is stored as the bytes it was sent as (valid JSON and UTF-8, as checked by
        `decode_samples`): not re-encoded, so whitespace, key order and number spelling stay.
        """
        samples = decode_samples(body)
        # A generator: each sample's bytes go to SQLite straight from the body (msgspec.Raw is a
        # buffer), no copy per sample; a sample without a sample_id raises, which rolls back.
        rows = ((evaluation_id, *_sample_keys(s, i), s) for i, s in enumerate(samples))
        with self._lock, self._conn:
            self._require_running(self._row(evaluation_id), "add samples")
            self._conn.executemany(
                "INSERT INTO samples (evaluation_id, sample_id, reward, body) VALUES (?, ?, ?, ?)",
                rows,
            )
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
        """`PUT /evaluations/{id}`: with a status, close the evaluation out (FAILED, CANCELLED;
        only while it runs: a closed one answers 409); with none, update its metadata and
        metrics (what verifiers 0.4's push sends before its finalize, and how evalpush marks an
        evaluation superseded), in any state."""
        if not isinstance(body, dict):
            raise Refusal(422, "the body must be a JSON object")
        status = body.get("status")
        if status is None:
            return self._update(evaluation_id, body)
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
                    body.get("error_message", row["error_message"]),
                    _ENCODER.encode(metadata) if metadata is not None else row["metadata"],
                    _ENCODER.encode(metrics) if metrics is not None else row["metrics"],
                    _now(),
                    evaluation_id,
                ),
            )
            return self._evaluation(self._row(evaluation_id))

    def _update(self, evaluation_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """`PUT` without a status: new metadata and metrics, in any state (the platform API's
        update); nothing else changes."""
        metadata, metrics = _object_or_none(body, "metadata"), _object_or_none(body, "metrics")
        with self._lock, self._conn:
            row = self._row(evaluation_id)
            self._conn.execute(
                "UPDATE evaluations SET metadata = ?, metrics = ?, updated_at = ? WHERE id = ?",
                (
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
            "has_more": page * limit < total,  # prime_evals' SamplesResponse requires it
        }

    def list_evaluations(
        self, environment_name: str | None, skip: int, limit: int, *, newest_first: bool = False
    ) -> dict[str, Any]:
        where, args = (
            ("WHERE environment_name = ?", [environment_name]) if environment_name else ("", [])
        )
        order = "seq DESC" if newest_first else "seq"
        with self._lock:
            total = self._conn.execute(
                f"SELECT COUNT(*) FROM evaluations {where}", args
            ).fetchone()[0]
            rows = self._conn.execute(
                f"SELECT * FROM evaluations {where} ORDER BY {order} LIMIT ? OFFSET ?",
                [*args, limit, skip],
            ).fetchall()
            return {
                "evaluations": [self._evaluation(r) for r in rows],
                "total": total,
                "skip": skip,
                "limit": limit,
            }

    # -- for the viewer pages -----------------------------------------------------------------

    def rewards(self, evaluation_id: str) -> list[float | None]:
        """Every stored sample's numeric reward (None for none), duplicates included."""
        with self._lock:
            self._row(evaluation_id)
            rows = self._conn.execute(
                "SELECT reward FROM samples WHERE evaluation_id = ?", (evaluation_id,)
            ).fetchall()
        return [row[0] for row in rows]

    def mean_rewards(self, evaluation_ids: list[str]) -> dict[str, float]:
        """The mean numeric reward of each evaluation's stored samples (absent: no reward)."""
        marks = ", ".join("?" * len(evaluation_ids))
        with self._lock:
            rows = self._conn.execute(
                f"SELECT evaluation_id, AVG(reward) FROM samples WHERE evaluation_id IN ({marks})"
                " AND reward IS NOT NULL GROUP BY evaluation_id",
                evaluation_ids,
            ).fetchall()
        return {row[0]: row[1] for row in rows}

    # -- for tests ----------------------------------------------------------------------------

    def raw_samples(self, evaluation_id: str) -> list[msgspec.Raw]:
        """Every stored sample of an evaluation as the JSON it came as, duplicates included."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT body FROM samples WHERE evaluation_id = ? ORDER BY rowid", (evaluation_id,)
            ).fetchall()
        return [msgspec.Raw(row["body"]) for row in rows]

    def samples(self, evaluation_id: str) -> list[dict[str, Any]]:
        """Every stored sample of an evaluation, duplicates included, in arrival order."""
        return [_DECODER.decode(raw) for raw in self.raw_samples(evaluation_id)]

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
