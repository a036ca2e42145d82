"""Finding a run's environment and its evaluation on the platform, at most once per process
where once is enough.

An environment's id (`resolve`, get-or-create) is asked once per process and name
(`Environments`): 10,000 runs of one environment need one resolve, not 10,000. A create the
platform refuses (the environment may have been deleted since) drops the name's id, so the next
run asks again.

A run's evaluation is found by its run id (`metadata.run_id`).

Before the upload creates an evaluation it looks for one the run already has: after a crash or
an ambiguous create (an intent is recorded), when the eval may have pushed itself (`push = true`
in its config), and for a run id the ledger never saw (the ledger was moved aside, or the run
was uploaded from elsewhere). The platform can only list an environment's evaluations, which is
O(evaluations) a run; for many new runs (10,000 one-trace runs at 300 runs/s) that would be
O(N^2). So:

- a **fresh** lookup lists the environment now; it is needed when an evaluation may have been
  created after this process started: an intent is recorded (this ledger may have sent the
  create) or the eval pushes itself;
- otherwise the environment is listed **once per process** and indexed by run id. That is enough
  for a run the ledger never saw: within this ledger, a create is only ever sent after its
  intent is recorded under the run's claim, so an evaluation created since the listing would
  have left an intent, and the run would take the fresh path.

Evaluations the run had before (its history, or forgotten) are never adopted; of the others,
the newest is. Evaluations of other runs whose ids are not platform ids (another tool's) are
listed and ignored; if the newest of this run's is such a one (a create answered with an id no
URL can carry), the run fails with why, and that evaluation is closed out (FAILED) where its id
can still be sent (one over `MAX_ID_CHARS`; `.` and `..` cannot be), so none is left RUNNING.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from typing import Any, Generic, Protocol, TypeVar

from evalpush.client.answers import MAX_ID_CHARS, Evaluation
from evalpush.core.errors import EvalpushError, RunError


class Lister(Protocol):
    def iter_evaluations(self, environment_name: str) -> Iterator[Evaluation]: ...

    def close_out(
        self, evaluation_id: str, status: str, error_message: str | None = None
    ) -> None: ...


class Resolver(Protocol):
    def resolve_environment(self, name: str) -> str: ...


Retry = Callable[[Callable[[], Any], str, str], Any]
"""`retry(fn, what, run)`: `fn()` under the retry policy, as a replayable call."""
V = TypeVar("V")


class _OncePerKey(Generic[V]):
    """Values by key, each made once per process: callers asking for one key together wait
    for one `make()` (thread-safe); `forget` has the next caller make it again."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._values: dict[str, V] = {}

    def get(self, key: str, make: Callable[[], V]) -> V:
        with self._guard:
            lock = self._locks[key]
        with lock:
            value = self._values.get(key)
            if value is None:
                value = self._values[key] = make()
            return value

    def forget(self, key: str) -> None:
        self._values.pop(key, None)


class Environments:
    """Environment ids by name, resolved once per process."""

    def __init__(self, client: Resolver, retry: Retry):
        self._client = client
        self._retry = retry
        self._ids = _OncePerKey[str]()

    def id_of(self, name: str, run_id: str) -> str:
        def resolve() -> str:
            return self._retry(
                lambda: self._client.resolve_environment(name), "resolve environment", run_id
            )

        return self._ids.get(name, resolve)

    def forget(self, name: str) -> None:
        """The platform refused a create in this environment: resolve it again next time."""
        self._ids.forget(name)


class EvaluationIndex:
    """The evaluations of each environment by run id, listed once per process."""

    def __init__(self, client: Lister, retry: Retry):
        self._client = client
        self._retry = retry
        self._by_env = _OncePerKey[dict[str, list[Evaluation]]]()

    def find(
        self, env_name: str, run_id: str, *, exclude: Callable[[], set[str]], fresh: bool
    ) -> Evaluation | None:
        """The run's newest evaluation not in `exclude()` (asked only when the listing holds
        one of the run's): from a listing made now (`fresh`), or from this process's listing
        of the environment."""
        if fresh:
            listed = self._list(env_name, run_id)
        else:
            listed = self._by_env.get(
                env_name, lambda: self._list(env_name, run_id, every_run=True)
            )
        found = _newest(listed.get(run_id, ()), exclude)
        if found is not None and not found.usable:
            raise RunError(self._closed_out(found.id, run_id))
        return found

    def _closed_out(self, evaluation_id: str, run_id: str) -> str:
        """Close out the run's evaluation whose id cannot be used; why the run fails."""
        why = (
            f"the platform gave run {run_id} an evaluation whose id evalpush cannot put into a "
            f"URL ({evaluation_id[:40]!r}: empty, a dot segment or over {MAX_ID_CHARS} characters)"
        )
        try:
            self._retry(
                lambda: self._client.close_out(evaluation_id, "FAILED", error_message=why),
                "close out",
                run_id,
            )
        except EvalpushError as exc:
            return f"{why}; it could not be closed out ({exc}): delete it on the platform"
        return f"{why}; it was closed out as FAILED"

    def _list(
        self, env_name: str, run_id: str, *, every_run: bool = False
    ) -> dict[str, list[Evaluation]]:
        """The environment's evaluations by run id, listed now: those of `run_id` (or of
        `every_run`)."""

        def listing() -> dict[str, list[Evaluation]]:
            index: dict[str, list[Evaluation]] = defaultdict(list)
            for evaluation in self._client.iter_evaluations(env_name):
                key = evaluation.run_id
                if key is not None and (every_run or key == run_id):
                    index[key].append(evaluation)
            return index

        return self._retry(listing, "list evaluations", run_id)


def _newest(
    candidates: Collection[Evaluation], exclude: Callable[[], set[str]]
) -> Evaluation | None:
    """The last one listed (the platform lists in creation order) that is not excluded
    (`exclude()` is asked only when there is a candidate: it reads the ledger). The caller
    checks its id: it may be the one this run created (a create answered with an unusable id
    is reconciled by this lookup), so it is neither adopted nor taken as "none": creating
    another could make a second evaluation, over and over."""
    excluded = exclude() if candidates else set()
    return next((e for e in reversed(list(candidates)) if e.id not in excluded), None)
