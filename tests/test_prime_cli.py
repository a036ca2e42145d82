"""The real `prime` CLI (the test extra) reads a local platform as it reads the platform.

A local platform is filled by a real `evalpush push` of the demo's runs; `prime eval list`,
`get` and `samples` then run as subprocesses pointed at it the supported offline way:
`PRIME_API_BASE_URL` and `PRIME_API_KEY`, a fresh `HOME` (prime writes `~/.prime/config.json`),
and `PRIME_DISABLE_VERSION_CHECK=1` (otherwise each command asks pypi.org for a newer version).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prime_evals.models import Evaluation, EvaluationListResponse, SamplesResponse

from demo_push import Pushed, push_demo_runs
from evalpush.local_platform import LocalPlatform
from support.environ import clean_environ

PRIME = Path(sys.executable).with_name("prime")
PRIME_SECONDS = 60
ENVIRONMENT, MODEL = "reverse-text", "openai/gpt-4.1-mini"
WIDE = "250"  # columns for prime's tables, so no cell is cut


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    with LocalPlatform() as platform:
        yield push_demo_runs(platform, tmp_path_factory.mktemp("prime"))


@pytest.fixture
def prime(pushed: Pushed, tmp_path: Path):
    """Run `prime ARGS...` against the pushed platform; its stdout, after checking its exit."""
    assert PRIME.exists(), f"no {PRIME}: install the test extra (pip install -e '.[test]')"
    env = clean_environ(
        PRIME_API_BASE_URL=pushed.platform.base_url,
        PRIME_API_KEY=pushed.platform.api_key or "any-key",
        PRIME_DISABLE_VERSION_CHECK="1",
        HOME=str(tmp_path),
        COLUMNS=WIDE,
    )

    def run(*args: str, exit_code: int = 0) -> str:
        done = subprocess.run(
            [str(PRIME), *args], env=env, capture_output=True, text=True, timeout=PRIME_SECONDS
        )
        assert done.returncode == exit_code, done.stdout + done.stderr
        return done.stdout

    return run


def table_rows(output: str) -> dict[str, list[str]]:
    """The rows of a rich table that `prime` printed, keyed by their first cell."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0] and not cells[0].startswith(("ID", "━", "─")):
            rows[cells[0]] = cells[1:]
    return rows


def trace_ids(pushed: Pushed, kind: str) -> list[str]:
    (traces,) = (pushed.outputs / f"{ENVIRONMENT}--{kind}").glob("*/traces.jsonl")
    return [orjson.loads(line)["id"] for line in traces.read_bytes().splitlines()]


class TestPrimeEval:
    def test_list_shows_each_evaluation_with_its_environment_model_status_and_counts(
        self, prime, pushed: Pushed
    ) -> None:
        evaluations = pushed.platform.summary()["evaluations"]

        rows = table_rows(prime("eval", "list"))

        assert set(rows) == set(evaluations) and len(rows) == 3
        for evaluation_id, cells in rows.items():
            examples = evaluations[evaluation_id]["metadata"]["num_examples"]
            assert cells == [ENVIRONMENT, MODEL, "COMPLETED", "LOCAL", str(examples), "2"]

    def test_list_filters_by_environment_and_pages(self, prime) -> None:
        assert len(table_rows(prime("eval", "list", "--env", ENVIRONMENT))) == 3
        assert "No evaluations found." in prime("eval", "list", "--env", "gsm8k")
        second_page = prime("eval", "list", "--num", "2", "--page", "2")
        assert len(table_rows(second_page)) == 1 and "Total: 3 evaluation(s)" in second_page

    def test_list_as_json_names_each_evaluation_s_environment(self, prime) -> None:
        listed = json.loads(prime("eval", "list", "--output", "json"))

        assert listed["total"] == 3
        assert [e["environment_names"] for e in listed["evaluations"]] == [[ENVIRONMENT]] * 3

    def test_get_shows_the_evaluation_as_evalpush_pushed_it(self, prime, pushed: Pushed) -> None:
        evaluation_id = pushed.evaluation_id("finished")
        run_id = next((pushed.outputs / f"{ENVIRONMENT}--finished").iterdir()).name

        evaluation = json.loads(prime("eval", "get", evaluation_id))

        assert evaluation["evaluation_id"] == evaluation_id
        assert evaluation["status"] == "COMPLETED"
        assert (evaluation["model_name"], evaluation["environment_names"]) == (MODEL, [ENVIRONMENT])
        assert evaluation["sample_count"] == evaluation["total_samples"] == 40
        assert evaluation["metadata"]["run_id"] == run_id
        assert evaluation["viewer_url"] == pushed.urls["finished"]

    def test_samples_pages_through_every_sample_pushed(self, prime, pushed: Pushed) -> None:
        evaluation_id = pushed.evaluation_id("finished")

        pages = [
            json.loads(prime("eval", "samples", evaluation_id, "--num", "25", "--page", page))
            for page in ("1", "2")
        ]

        assert [len(page["samples"]) for page in pages] == [25, 15]
        assert [(page["total"], page["has_more"]) for page in pages] == [(40, True), (40, False)]
        sent = [sample["sample_id"] for page in pages for sample in page["samples"]]
        assert sent == trace_ids(pushed, "finished")

    def test_an_unknown_evaluation_is_an_error_saying_it_was_not_found(self, prime) -> None:
        output = prime("eval", "get", "no-such-evaluation", exit_code=1)

        assert "404" in output and "evaluation no-such-evaluation not found" in output


class TestPrimeEvalsModels:
    """prime_evals (the SDK the CLI is built on) declares the answers' shapes; they must fit."""

    def get(self, pushed: Pushed, path: str, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {pushed.platform.api_key}"}
        answer = httpx.get(
            f"{pushed.platform.base_url}/api/v1{path}", headers=headers, params=params
        )
        assert answer.status_code == 200, answer.text
        return answer.json()

    def test_an_evaluation_a_list_and_a_samples_page_validate(self, pushed: Pushed) -> None:
        evaluation_id = pushed.evaluation_id("finished")

        evaluation = Evaluation.model_validate(self.get(pushed, f"/evaluations/{evaluation_id}"))
        listed = EvaluationListResponse.model_validate(self.get(pushed, "/evaluations/"))
        page = self.get(pushed, f"/evaluations/{evaluation_id}/samples", page=4, limit=10)
        # The page, not its samples: prime_evals' Sample model predates the samples verifiers
        # sends (its `task` is a string; docs/TRACE_FORMAT.md's, like verifiers' own push, an object).
        envelope = SamplesResponse.model_validate({**page, "samples": []})

        assert (evaluation.id, evaluation.total_samples, evaluation.model_name) == (
            evaluation_id,
            40,
            MODEL,
        )
        assert listed.total == 3 and evaluation_id in {e.id for e in listed.evaluations}
        assert (len(page["samples"]), envelope.total, envelope.has_more) == (10, 40, False)
