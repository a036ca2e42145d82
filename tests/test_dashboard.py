"""The local platform's viewer pages, read as HTML and opened in a real headless chromium.

`TestViewerPages` and `TestHistogram` need no browser. `TestInChromium` fills a local platform
through a real `evalpush push` of the demo's runs, opens the viewer URLs that push printed, and
checks what a person sees; it skips, saying why, where chromium is missing or cannot run.
`pytest tests/test_dashboard.py --viewer-screenshot docs/viewer.png` regenerates the README's
screenshot from the page this test opens.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from browser import Chromium, Page, chromium, why_chromium_cannot_run
from demo_push import Pushed, push_demo_runs
from evalpush.local_platform import LocalPlatform
from evalpush.local_platform._dashboard import (
    HISTOGRAM_BINS,
    MESSAGE_CHARS_SHOWN,
    SAMPLES_PER_PAGE,
    TRANSCRIPT_CHARS_SHOWN,
    Bar,
    histogram,
)
from evalpush.local_platform._store import Store
from support.runs import config_toml, trace_line, write_run

SCRIPT = "<script>document.body.setAttribute('data-pwned', '1')</script>"
IMG = "\"><img src=x onerror=\"document.body.setAttribute('data-pwned', '2')\">"
HOSTILE = f"{SCRIPT}{IMG}"
PAGE_BYTES_BOUND = 2_000_000  # a page of 100 ordinary samples is ~0.3 MB


@dataclass
class Api:
    """A client of a local platform's API and its viewer pages."""

    http: httpx.Client
    base_url: str

    def evaluation(self, name: str = "gsm8k--org/model--run1", env: str = "gsm8k", **body) -> str:
        env_id = self.http.post("/api/v1/environmentshub/resolve", json={"name": env}).json()
        create = {"name": name, "environments": [{"id": env_id["data"]["id"]}], **body}
        answer = self.http.post("/api/v1/evaluations/", json=create)
        assert answer.status_code == 200, answer.text
        return answer.json()["evaluation_id"]

    def push(self, evaluation_id: str, samples: list[dict[str, Any]]) -> None:
        answer = self.http.post(
            f"/api/v1/evaluations/{evaluation_id}/samples",
            content=orjson.dumps({"samples": samples}),
        )
        assert answer.status_code == 200, answer.text

    def finalize(self, evaluation_id: str, metrics: dict[str, Any]) -> None:
        answer = self.http.post(
            f"/api/v1/evaluations/{evaluation_id}/finalize", json={"metrics": metrics}
        )
        assert answer.status_code == 200, answer.text

    def page(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.base_url}{path}", timeout=30.0)  # as a browser: no key


@pytest.fixture
def api(local_platform: LocalPlatform) -> Iterator[Api]:
    headers = {"Authorization": f"Bearer {local_platform.api_key}"}
    with httpx.Client(base_url=local_platform.base_url, headers=headers, timeout=30.0) as http:
        yield Api(http, local_platform.base_url)


def sample(i: int, reward: Any = 1.0, text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "sample_id": f"s{i}",
        "example_id": i // 2,
        "rollout_number": i % 2 + 1,
        "completion": [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": text if text is not None else f"answer {i}"},
        ],
        "answer": f"expected {i}",
        "reward": reward,
        **extra,
    }


def bars_drawn(page: Page) -> list[int]:
    """The sample count of each histogram bar, read from the bars' tooltips."""
    tips = [e.content for e in page.find("title") if e.within("svg", "histogram")]
    return [int(re.search(r": ([\d,]+) samples", tip)[1].replace(",", "")) for tip in tips]


class TestViewerPages:
    def test_an_evaluation_page_shows_its_name_model_environment_status_metrics_and_samples(
        self, api: Api
    ) -> None:
        evaluation_id = api.evaluation(model_name="org/model", metadata={"run_id": "run-1"})
        api.push(evaluation_id, [sample(0, 1.0), sample(1, 0.0), sample(2, 1.0)])
        api.finalize(evaluation_id, {"avg_reward": 0.6667, "avg_metrics": {"correct": 0.6667}})

        answer = api.page(f"/dashboard/evaluations/{evaluation_id}")

        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/html")
        page = Page(answer.text)
        heading = page.find("h1")[0].content
        assert "gsm8k--org/model--run1" in heading and "COMPLETED" in heading
        facts = page.find("dl", "facts")[0].content
        assert "org/model" in facts and "gsm8k" in facts and evaluation_id in facts
        assert "avg_metrics.correct" in page.text and "0.6667" in page.text
        assert "run_id" in page.text and "run-1" in page.text
        rows = page.sample_rows()
        assert [row.content.split()[:2] for row in rows] == [["1", "s0"], ["2", "s1"], ["3", "s2"]]
        assert bars_drawn(page) == [1, 2]  # reward 0 once, reward 1 twice
        transcript = page.find("div", "transcript")[0].content
        assert (
            "question 0" in transcript and "answer 0" in transcript and "expected 0" in transcript
        )

    def test_a_running_evaluations_page_says_so_and_reloads_itself_as_its_samples_grow(
        self, api: Api
    ) -> None:
        evaluation_id = api.evaluation(model_name="org/model", metadata={"run_id": "run-1"})
        api.push(evaluation_id, [sample(0), sample(1)])
        first_html = api.page(f"/dashboard/evaluations/{evaluation_id}").text
        first = Page(first_html)
        api.push(evaluation_id, [sample(2)])
        second = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)
        api.finalize(evaluation_id, {"avg_reward": 1.0})
        done = api.page(f"/dashboard/evaluations/{evaluation_id}").text

        assert "RUNNING" in first.find("h1")[0].content
        assert "Running: 2 samples so far" in first.text
        assert "Running: 3 samples so far" in second.text
        assert '<meta http-equiv="refresh" content="5">' in first_html
        assert "refresh" not in done and "Running:" not in done

    def test_every_value_a_client_sent_is_shown_as_text_never_as_markup(self, api: Api) -> None:
        evaluation_id = api.evaluation(
            name=f"name {HOSTILE}",
            env=f"env {HOSTILE}",
            model_name=f"model {HOSTILE}",
            metadata={f"key {HOSTILE}": f"value {HOSTILE}"},
        )
        hostile = sample(
            0,
            reward=HOSTILE,
            text=HOSTILE,
            sample_id=HOSTILE,
            example_id=HOSTILE,
            answer=HOSTILE,
            error={"error": HOSTILE},
        )
        hostile["completion"].append(
            {"role": HOSTILE, "content": [{"type": "text", "text": HOSTILE}, {"x": HOSTILE}]}
        )
        hostile["completion"].append(
            {"role": "assistant", "content": None, "tool_calls": [{"name": HOSTILE}]}
        )
        api.push(evaluation_id, [hostile])
        api.http.put(
            f"/api/v1/evaluations/{evaluation_id}",
            json={"status": "FAILED", "error_message": HOSTILE, "metrics": {HOSTILE: HOSTILE}},
        )

        for path in (f"/dashboard/evaluations/{evaluation_id}", "/dashboard/evaluations"):
            markup = api.page(path).text
            page = Page(markup)
            assert not page.find("script") and not page.find("img"), path
            handlers = [a for e in page.elements for a in e.attrs if a.startswith("on")]
            assert handlers == [], path
            assert SCRIPT in page.text and IMG in page.text, path
        assert page.text.count(HOSTILE) >= 3  # name, environment, model in the list row
        detail = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)
        # name, environment, model, metadata key and value, metric name and value, error message,
        # sample id, example id, reward, each message part, tool call, answer, error
        assert detail.text.count(SCRIPT) >= 15

    def test_the_pages_load_nothing_from_anywhere_else(self, api: Api) -> None:
        evaluation_id = api.evaluation()
        api.push(evaluation_id, [sample(i) for i in range(3)])

        for path in ("/dashboard/evaluations", f"/dashboard/evaluations/{evaluation_id}"):
            answer = api.page(path)
            policy = answer.headers["content-security-policy"]
            assert "default-src 'none'" in policy and "script-src" not in policy
            links = [
                value
                for element in Page(answer.text).elements
                for name, value in element.attrs.items()
                if name in ("src", "href", "action", "srcset", "xlink:href")
            ]
            assert links, path
            outside = [v for v in links if not re.match(r"(/(?!/)|\?|#|data:)", v)]
            assert outside == [], path

    def test_samples_are_shown_a_hundred_a_page_with_links_between_pages(self, api: Api) -> None:
        evaluation_id = api.evaluation()
        api.push(evaluation_id, [sample(i) for i in range(250)])
        path = f"/dashboard/evaluations/{evaluation_id}"

        first, last = Page(api.page(path).text), Page(api.page(f"{path}?page=3").text)

        assert SAMPLES_PER_PAGE == 100
        assert len(first.sample_rows()) == 100 and len(last.sample_rows()) == 50
        assert last.sample_rows()[0].content.split()[:2] == ["201", "s200"]
        assert "1–100 of 250" in first.text and "page 1 of 3" in first.text
        assert {a.attrs["href"] for a in first.find("a") if a.within("nav", "pager")} == {
            "?page=2",
            "?page=3",
        }
        assert bars_drawn(first) == [250]  # every sample in the histogram, not just this page
        beyond = Page(api.page(f"{path}?page=4").text)
        assert beyond.sample_rows() == [] and "No samples on this page" in beyond.text
        for bad in ("0", "x", "-1", "²", "", str(1 << 64)):
            refused = api.page(f"{path}?page={bad}")
            assert refused.status_code == 400 and "page must be" in Page(refused.text).text

    def test_a_20000_sample_evaluation_is_a_page_of_ordinary_size(self, api: Api) -> None:
        evaluation_id = api.evaluation()
        text = "x" * 3000  # ~3.4 KB a sample: ~68 MB stored
        for start in range(0, 20_000, 5_000):
            api.push(
                evaluation_id, [sample(i, i % 3 / 2, text) for i in range(start, start + 5000)]
            )

        answer = api.page(f"/dashboard/evaluations/{evaluation_id}?page=200")

        assert answer.status_code == 200
        assert len(answer.content) < PAGE_BYTES_BOUND
        page = Page(answer.text)
        assert len(page.sample_rows()) == 100 and "page 200 of 200" in page.text
        assert bars_drawn(page) == [6667, 6667, 6666]  # rewards 0, 0.5, 1 over all 20,000

    def test_a_long_message_is_cut_with_a_note_of_how_much_is_not_shown(self, api: Api) -> None:
        evaluation_id = api.evaluation()
        api.push(evaluation_id, [sample(0, text="y" * (MESSAGE_CHARS_SHOWN + 30_000))])

        page = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)

        assert "y" * MESSAGE_CHARS_SHOWN in page.text
        assert "y" * (MESSAGE_CHARS_SHOWN + 1) not in page.text
        assert "… 30,000 more characters not shown" in page.text

    def test_a_transcript_of_many_messages_stops_with_a_note_of_how_many_are_not_shown(
        self, api: Api
    ) -> None:
        evaluation_id = api.evaluation()
        chatty = sample(0)
        chatty["completion"] = [
            {"role": "user", "content": f"turn {i:03d} " + "z" * 992} for i in range(300)
        ]
        api.push(evaluation_id, [chatty])

        page = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)

        shown = page.find("div", "message")
        assert len(shown) == TRANSCRIPT_CHARS_SHOWN // 1000
        assert shown[-1].content.startswith(f"user turn {len(shown) - 1:03d}")
        assert f"… {300 - len(shown)} more messages not shown" in page.text

    def test_samples_with_odd_rewards_are_stored_and_counted_as_without_a_reward(
        self, api: Api
    ) -> None:
        evaluation_id = api.evaluation()
        odd = [sample(0, "high"), sample(1, None), sample(2, True), sample(3, [1])]
        del odd[3]["reward"]
        api.push(evaluation_id, [*odd, sample(4, 0.5)])

        page = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)

        assert len(page.sample_rows()) == 5
        assert bars_drawn(page) == [1] and "4 without a numeric reward" in page.text

    def test_a_sample_json_cannot_hold_as_numbers_is_shown_as_it_came(self, api: Api) -> None:
        evaluation_id = api.evaluation()
        answer = api.http.post(
            f"/api/v1/evaluations/{evaluation_id}/samples",
            content=b'{"samples":[{"sample_id":"big","reward":1e400,"x":1}]}',
        )
        assert answer.status_code == 200

        page = Page(api.page(f"/dashboard/evaluations/{evaluation_id}").text)

        assert len(page.sample_rows()) == 1
        assert '{"sample_id":"big","reward":1e400,"x":1}' in page.text
        assert "1 without a numeric reward" in page.text  # infinity is not drawn

    def test_the_list_shows_each_evaluation_newest_first_with_its_mean_sample_reward(
        self, api: Api
    ) -> None:
        older = api.evaluation("older", env="env-a", model_name="model-a")
        api.push(older, [sample(0, 1.0), sample(1, 0.0)])
        api.finalize(older, {})
        newer = api.evaluation("newer", env="env-b", model_name="model-b")
        api.push(newer, [sample(0, 0.25)])

        page = Page(api.page("/dashboard/evaluations").text)

        rows = [row.content for row in page.find("tr") if row.within("tbody")]
        assert rows[0].split()[:6] == ["newer", "env-b", "model-b", "RUNNING", "1", "0.25"]
        assert rows[1].split()[:6] == ["older", "env-a", "model-a", "COMPLETED", "2", "0.5"]
        links = [a.attrs["href"] for a in page.find("a") if a.within("td", "name")]
        assert links == [f"/dashboard/evaluations/{newer}", f"/dashboard/evaluations/{older}"]

    def test_an_unknown_evaluation_is_a_404_page_and_the_root_leads_to_the_list(
        self, api: Api
    ) -> None:
        missing = api.page("/dashboard/evaluations/no-such-id")
        assert missing.status_code == 404
        assert "evaluation no-such-id not found" in Page(missing.text).text
        for path in ("/", "/dashboard", "/dashboard/", "/dashboard/evaluations/"):
            home = api.http.get(path, follow_redirects=False)
            assert (home.status_code, home.headers["location"]) == (302, "/dashboard/evaluations")

    def test_a_database_file_from_before_the_reward_column_gets_it_filled_in(
        self, tmp_path: Path
    ) -> None:
        db = tmp_path / "old.db"
        with sqlite3.connect(db) as old:
            old.executescript(
                "CREATE TABLE samples (evaluation_id TEXT NOT NULL, sample_id TEXT NOT NULL,"
                " body BLOB NOT NULL);"
                "CREATE TABLE evaluations (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL"
                " UNIQUE, environment_id TEXT NOT NULL, environment_name TEXT NOT NULL, name TEXT"
                " NOT NULL, status TEXT NOT NULL, fields BLOB NOT NULL, metadata BLOB NOT NULL,"
                " metrics BLOB NOT NULL, error_message TEXT, sample_count INTEGER NOT NULL DEFAULT"
                " 0, finalize_count INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL,"
                " updated_at TEXT NOT NULL);"
                "INSERT INTO evaluations (id, environment_id, environment_name, name, status,"
                " fields, metadata, metrics, sample_count, created_at, updated_at) VALUES"
                " ('e1', 'env', 'gsm8k', 'n', 'RUNNING', '{}', '{}', '{}', 2, 't', 't');"
                """INSERT INTO samples VALUES ('e1', 'a', '{"sample_id":"a","reward":0.75}');"""
                """INSERT INTO samples VALUES ('e1', 'b', '{"sample_id":"b"}');"""
            )
        old.close()

        store = Store(db)
        try:
            assert store.rewards("e1") == [0.75, None]
            assert store.mean_rewards(["e1"]) == {"e1": 0.75}
        finally:
            store.close()


class TestHistogram:
    def test_a_few_distinct_rewards_get_a_bar_each(self) -> None:
        assert histogram([1.0, 0.0, 1.0, 1.0]) == ([Bar(0.0, 0.0, 1), Bar(1.0, 1.0, 3)], 0)

    def test_many_distinct_rewards_fall_in_equal_ranges_from_lowest_to_highest(self) -> None:
        rewards = [i / 99 for i in range(100)]
        bars, missing = histogram(rewards)
        assert missing == 0 and len(bars) == HISTOGRAM_BINS
        assert [bar.count for bar in bars] == [10] * 10
        assert bars[0].low == 0.0 and bars[-1].high == 1.0  # the highest lands in the last bar

    def test_rewards_at_the_ends_of_the_float_range_are_binned_too(self) -> None:
        rewards = [-1.7e308, 1.7e308, *range(20)]
        bars, missing = histogram(rewards)
        assert missing == 0 and sum(bar.count for bar in bars) == 22
        assert (bars[0].count, bars[-1].count) == (1, 1)  # 0..19 are all in the middle bins
        assert all(math.isfinite(bar.low) and math.isfinite(bar.high) for bar in bars)

    def test_missing_and_non_finite_rewards_are_counted_apart(self) -> None:
        assert histogram([None, float("inf"), float("nan"), 2.0]) == ([Bar(2.0, 2.0, 1)], 3)

    def test_no_rewards_draw_no_bars(self) -> None:
        assert histogram([]) == ([], 0)


# -- in a real browser -----------------------------------------------------------------------

HOSTILE_TASKSET = "hostile-env"


def write_hostile_run(root: Path) -> Path:
    """A run whose one trace's prompt and completion hold markup that would run as script."""
    trace = trace_line(0, sample_id="hostile-trace", prompt=HOSTILE, answer=HOSTILE, reward=1.0)
    return write_run(
        root,
        [trace],
        run_id="0f0e0d0c-0b0a-4908-8706-050403020100",
        group=f"{HOSTILE_TASKSET}--m",
        config=config_toml(env=HOSTILE_TASKSET, num_rollouts=1, num_tasks=1, push=None),
    )


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    scratch = tmp_path_factory.mktemp("viewer")
    write_hostile_run(scratch / "outputs")
    with LocalPlatform() as platform:
        yield push_demo_runs(platform, scratch)


@pytest.fixture
def browser(tmp_path: Path) -> Chromium:
    reason = why_chromium_cannot_run()
    if reason is not None:
        pytest.skip(f"browser test skipped: {reason}")
    return chromium(tmp_path / "chromium")


class TestInChromium:
    def test_the_demo_run_printed_viewer_url_shows_the_evaluation_to_a_person(
        self, pushed: Pushed, browser: Chromium
    ) -> None:
        url = pushed.urls["finished"]
        evaluation = pushed.platform.summary()["evaluations"][pushed.evaluation_id("finished")]
        first_trace = orjson.loads(
            next((pushed.outputs / "reverse-text--finished").glob("*/traces.jsonl"))
            .read_bytes()
            .splitlines()[0]
        )

        page = Page(browser.dump_dom(url))

        assert evaluation["name"] in page.title
        assert page.find("h1")[0].content == f"{evaluation['name']} COMPLETED"
        assert "reverse-text" in page.text and "openai/gpt-4.1-mini" in page.text
        rows = page.sample_rows()
        assert len(rows) == evaluation["sample_count"] == 40
        assert rows[0].content.split()[1] == first_trace["id"]
        transcript = page.find("div", "transcript")[0].content
        assert first_trace["task"]["prompt"] in transcript
        assert sum(bars_drawn(page)) == 40

    def test_a_fragment_naming_a_sample_opens_its_transcript(
        self, pushed: Pushed, browser: Chromium
    ) -> None:
        page = Page(browser.dump_dom(pushed.urls["finished"] + "#sample-3"))

        opened = [e for e in page.find("details") if "open" in e.attrs]
        assert len(opened) == 1 and opened[0].within("table", "samples")
        assert page.sample_rows()[2].content.split()[0] == "3"
        assert [d for d in page.find("details") if d.within("tr")].index(opened[0]) == 2

    def test_a_sample_holding_script_is_shown_as_text_and_nothing_runs(
        self, pushed: Pushed, browser: Chromium
    ) -> None:
        page = Page(browser.dump_dom(pushed.urls["m"] + "#sample-1"))

        body = page.find("body")[0]
        assert "data-pwned" not in body.attrs
        assert not page.find("script") and not page.find("img")
        transcript = page.find("div", "transcript")[0].content
        assert (
            transcript.count(SCRIPT) == 3 and transcript.count(IMG) == 3
        )  # user, assistant, answer

    def test_a_screenshot_of_an_evaluation_with_a_transcript_open(
        self, pushed: Pushed, browser: Chromium, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        # The 10-sample run: its whole page fits the window, so the fragment scrolls nothing.
        # The page's content is what the tests above check; this one keeps its picture.
        url = pushed.urls["legacy-results"] + "#sample-2"
        keep: Path | None = request.config.getoption("--viewer-screenshot")
        out = keep or tmp_path / "viewer.png"

        browser.screenshot(url, out, width=1280, height=1500)

        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert out.stat().st_size > 20_000  # a rendered page, not a blank one
