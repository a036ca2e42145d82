"""The convert stage: docs/TRACE_FORMAT.md sections 4-6, one rule per test, and every bad line kind."""

from __future__ import annotations

import array
import base64
import json
import math
import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest

from evalpush.convert import (
    Converted,
    RolloutCounter,
    RunTotals,
    Trace,
    build_sample,
    convert_lines,
    decode_tally,
    decode_trace,
    encode_sample,
    scan,
    summary,
    tally,
)
from evalpush.core.errors import BadRecord
from evalpush.core.setaside import SetAside
from evalpush.core.states import SetAsideKind
from evalpush.runs import Run, RunKind, read_lines
from support.producer import gen_traces

MIB = 1024 * 1024
MANGLED_LINES = 3000
RUN_ID = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
TRUNCATING = [
    "max_turns",
    "max_input_tokens",
    "max_output_tokens",
    "max_total_tokens",
    "context_length",
    "harness_timeout",
]
CORE_KEYS = {
    "sample_id",
    "example_id",
    "rollout_number",
    "task",
    "prompt",
    "completion",
    "answer",
    "reward",
    "timing",
    "is_completed",
    "is_truncated",
    "metrics",
    "error",
    "stop_condition",
    "trajectory",
    "token_usage",
    "info",
}


# ---------------------------------------------------------------- helpers


def node(content: str = "", *, role: str = "assistant", parent: int | None = None, **fields):
    """A MessageNode as the producer writes it (a null parent is omitted)."""
    n: dict[str, Any] = {"message": {"role": role, "content": content}, **fields}
    if parent is not None:
        n["parent"] = parent
    return n


def usage(prompt: int, completion: int, **optional: Any) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, **optional}


def trace(id: str = "t", idx: int = 0, **fields: Any) -> dict[str, Any]:
    return {"id": id, "task": {"idx": idx}, **fields}


def checked(t: dict[str, Any]) -> Trace:
    return decode_trace(orjson.dumps(t), 1)


def sample_of(t: dict[str, Any], rollout_number: int = 1) -> dict[str, Any]:
    """The sample as it goes out: built, encoded, and read back."""
    return orjson.loads(encode_sample(build_sample(checked(t), rollout_number), 1))


sent = sample_of


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


def convert_file(
    path: Path, raw_lines: list[bytes], *, max_line_bytes: int = MIB
) -> tuple[list[Converted | SetAside], RunTotals]:
    """Write the lines to a file and convert it as a run does."""
    path.write_bytes(b"".join(raw + b"\n" for raw in raw_lines))
    totals = RunTotals()
    lines = read_lines(path, max_line_bytes=max_line_bytes)
    return list(convert_lines(lines, totals, max_line_bytes=max_line_bytes)), totals


def a_run(env_name: str = "gsm8k", model: str = "org/model", num_rollouts: int = 2) -> Run:
    return Run(
        path=Path("/runs") / RUN_ID,
        run_id=RUN_ID,
        kind=RunKind.EVAL,
        traces_path=Path("/runs") / RUN_ID / "traces.jsonl",
        env_name=env_name,
        model=model,
        num_rollouts=num_rollouts,
        num_tasks=None,
        pushed_inline=False,
    )


def tree() -> list[dict[str, Any]]:
    """system -> user -> {a1 -> {a1x, a1y}, a2}: leaves 3 (a2), 4 (a1x), 5 (a1y)."""
    return [
        node("sys", role="system"),
        node("user", role="user", parent=0),
        node("a1", parent=1),
        node("a2", parent=1),
        node("a1x", parent=2),
        node("a1y", parent=2),
    ]


# ---------------------------------------------------------------- section 4: derived views


class TestBranches:
    def test_one_branch_per_leaf_root_to_leaf_in_ascending_leaf_order(self):
        sample = sample_of(trace(nodes=tree()))

        assert [contents(b["messages"]) for b in sample["trajectory"]] == [
            ["sys", "user", "a2"],
            ["sys", "user", "a1", "a1x"],
            ["sys", "user", "a1", "a1y"],
        ]

    def test_leaf_order_is_by_leaf_index_even_when_a_parent_comes_later(self):
        nodes = [
            node("root", role="user"),
            node("leaf1", parent=3),
            node("leaf2", parent=0),
            node("mid", parent=0),
        ]

        sample = sample_of(trace(nodes=nodes))

        assert [contents(b["messages"]) for b in sample["trajectory"]] == [
            ["root", "mid", "leaf1"],
            ["root", "leaf2"],
        ]

    def test_a_linear_conversation_has_one_branch(self):
        nodes = [node("u", role="user"), node("a", parent=0), node("t", role="tool", parent=1)]

        sample = sample_of(trace(nodes=nodes))

        assert [contents(b["messages"]) for b in sample["trajectory"]] == [["u", "a", "t"]]

    def test_separate_roots_each_give_a_branch(self):
        nodes = [node("r1", role="user"), node("r2", role="user"), node("a", parent=0)]

        sample = sample_of(trace(nodes=nodes))

        assert [contents(b["messages"]) for b in sample["trajectory"]] == [["r2"], ["r1", "a"]]

    def test_completion_is_the_last_branchs_messages(self):
        sample = sample_of(trace(nodes=tree()))

        assert sample["completion"] == sample["trajectory"][-1]["messages"]
        assert contents(sample["completion"]) == ["sys", "user", "a1", "a1y"]

    def test_no_nodes_means_an_empty_completion_and_trajectory(self):
        sample = sample_of(trace())

        assert (sample["completion"], sample["trajectory"]) == ([], [])

    def test_null_keys_of_each_message_are_dropped(self):
        message = {"role": "assistant", "content": "hi", "tool_calls": None, "name": None}

        sample = sample_of(trace(nodes=[{"message": message}]))

        assert sample["completion"] == [{"role": "assistant", "content": "hi"}]
        assert sample["trajectory"][0]["messages"] == [{"role": "assistant", "content": "hi"}]


class TestInputTokens:
    def test_all_tokens_minus_the_last_masked_nodes_completion(self):
        nodes = [
            node(token_ids=[1, 2, 3], mask=[False, False, False]),
            node(parent=0, token_ids=[4, 5], mask=[True, True]),
        ]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 3

    def test_the_last_node_with_a_true_mask_entry_counts_not_a_later_unmasked_one(self):
        nodes = [
            node(token_ids=[1, 2], mask=[False, False]),
            node(parent=0, token_ids=[3, 4, 5], mask=[True, False, True]),
            node(parent=1, token_ids=[6], mask=[False]),
        ]

        # total 6, last = 2 (node 1's true entries; node 2 has none)
        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 4

    def test_zero_falls_back_to_the_last_usage_input_size_with_cached_tokens(self):
        nodes = [
            node(usage=usage(10, 3, cached_input_tokens=4)),
            node(parent=0, usage=usage(20, 5, cached_input_tokens=7)),
            node(role="tool", parent=1),  # no usage: the one before it is the last
        ]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 27

    def test_tokens_that_are_all_the_last_completion_also_fall_back_to_usage(self):
        nodes = [node(token_ids=[1, 2], mask=[True, True], usage=usage(9, 2))]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 9

    def test_usage_without_cached_tokens_counts_prompt_tokens_only(self):
        nodes = [node(usage=usage(12, 1))]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 12

    def test_no_tokens_and_no_usage_is_zero(self):
        nodes = [node("u", role="user"), node("a", parent=0)]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_input_tokens"] == 0

    def test_each_branch_counts_only_the_nodes_on_its_path(self):
        nodes = [
            node("u", role="user"),
            node("a", parent=0, usage=usage(100, 1)),
            node("b", parent=0, usage=usage(200, 2)),
        ]

        trajectory = sample_of(trace(nodes=nodes))["trajectory"]

        assert [b["num_input_tokens"] for b in trajectory] == [100, 200]
        assert [b["num_output_tokens"] for b in trajectory] == [1, 2]


class TestOutputTokens:
    def test_the_sum_of_true_mask_entries_over_the_path(self):
        nodes = [
            node(token_ids=[1], mask=[True], usage=usage(5, 50)),
            node(parent=0, token_ids=[2, 3, 4], mask=[True, True, False], usage=usage(5, 50)),
        ]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_output_tokens"] == 3

    def test_without_masks_the_summed_completion_tokens_of_the_paths_usages(self):
        nodes = [
            node(usage=usage(10, 3)),
            node(role="tool", parent=0),
            node(parent=1, usage=usage(20, 5)),
        ]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_output_tokens"] == 8

    def test_no_masks_and_no_usage_is_zero(self):
        nodes = [node("u", role="user"), node("a", parent=0, mask=[False])]

        assert sample_of(trace(nodes=nodes))["trajectory"][0]["num_output_tokens"] == 0


class TestTokenUsage:
    def test_no_usage_anywhere_is_null(self):
        assert sample_of(trace(nodes=[node("a")]))["token_usage"] is None

    def test_sums_over_all_nodes_and_optional_fields_over_those_that_report_them(self):
        nodes = [
            node("u", role="user"),
            node("a", parent=0, usage=usage(1, 2, cached_input_tokens=3, cost=0.5)),
            node("b", parent=0, usage=usage(10, 20, cost=0.25)),
            node("c", parent=1, usage=usage(100, 200)),
        ]

        token_usage = sample_of(trace(nodes=nodes))["token_usage"]

        assert token_usage == {
            "prompt_tokens": 111,
            "completion_tokens": 222,
            "cached_input_tokens": 3,
            "cost": 0.75,
        }

    def test_a_null_optional_field_is_not_reported(self):
        nodes = [node(usage=usage(1, 1, reasoning_tokens=None))]

        assert sample_of(trace(nodes=nodes))["token_usage"] == usage(1, 1)

    def test_judge_calls_in_extra_usage_are_not_counted(self):
        t = trace(nodes=[node(usage=usage(5, 6))], extra_usage=[usage(1000, 1000, cost=9.0)])

        assert sample_of(t)["token_usage"] == usage(5, 6)


class TestRewardAndError:
    def test_the_reward_is_the_sum_of_the_rewards(self):
        assert sample_of(trace(rewards={"a": 0.5, "b": 0.25, "c": -1.0}))["reward"] == -0.25

    def test_no_rewards_is_a_reward_of_zero(self):
        assert sample_of(trace())["reward"] == 0

    def test_the_error_is_the_last_one_with_its_null_keys_dropped(self):
        errors = [
            {"type": "First", "message": "m1", "traceback": "tb1"},
            {"type": "Last", "message": "m2", "traceback": None},
        ]

        assert sample_of(trace(errors=errors))["error"] == {"type": "Last", "message": "m2"}

    def test_no_errors_is_a_null_error(self):
        assert sample_of(trace(errors=[]))["error"] is None


class TestTruncation:
    @pytest.mark.parametrize("stop_condition", TRUNCATING)
    def test_a_truncating_stop_condition_truncates(self, stop_condition):
        nodes = [node(sampled=True, finish_reason="stop")]

        assert sample_of(trace(nodes=nodes, stop_condition=stop_condition))["is_truncated"]

    def test_another_stop_condition_does_not(self):
        assert not sample_of(trace(stop_condition="completed"))["is_truncated"]

    def test_the_last_sampled_node_stopping_for_length_truncates(self):
        nodes = [
            node(sampled=True, finish_reason="stop"),
            node(parent=0, sampled=True, finish_reason="length"),
        ]

        assert sample_of(trace(nodes=nodes))["is_truncated"]

    def test_an_earlier_sampled_node_stopping_for_length_does_not(self):
        nodes = [
            node(sampled=True, finish_reason="length"),
            node(parent=0, sampled=True, finish_reason="stop"),
        ]

        assert not sample_of(trace(nodes=nodes))["is_truncated"]

    def test_a_later_node_that_was_not_sampled_does_not_matter(self):
        nodes = [
            node(sampled=True, finish_reason="length"),
            node("tool out", role="tool", parent=0, finish_reason="stop"),
        ]

        assert sample_of(trace(nodes=nodes))["is_truncated"]

    def test_the_last_sampled_node_is_found_over_all_nodes_not_one_branch(self):
        nodes = [
            node("u", role="user"),
            node("b1", parent=0, sampled=True, finish_reason="stop"),
            node("b2", parent=0, sampled=True, finish_reason="length"),
            node("t", role="tool", parent=1),
        ]

        assert sample_of(trace(nodes=nodes))["is_truncated"]

    def test_no_sampled_node_is_not_truncated(self):
        assert not sample_of(trace(nodes=[node(finish_reason="length")]))["is_truncated"]


# ---------------------------------------------------------------- section 5: the sample


class TestSample:
    def test_a_full_trace_becomes_the_sample_of_the_table(self):
        t = trace(
            id="rollout-7",
            idx=3,
            nodes=[node("q", role="user"), node("a", parent=0)],
            rewards={"correct": 1.0},
            metrics={"turns": 2.0},
            info={"log": "ok"},
            is_completed=True,
            stop_condition="completed",
            timing={"start": 1.5, "generation": {"start": 1.5, "end": None}},
        )
        t["task"].update(prompt="q", answer="42", extra=None)

        sample = sample_of(t, rollout_number=2)

        assert sample == {
            "sample_id": "rollout-7",
            "example_id": 3,
            "rollout_number": 2,
            "task": {"idx": 3, "prompt": "q", "answer": "42"},
            "prompt": [],
            "completion": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "answer": "42",
            "reward": 1.0,
            "timing": {"start": 1.5, "generation": {"start": 1.5}},
            "is_completed": True,
            "is_truncated": False,
            "metrics": {"turns": 2.0},
            "error": None,
            "stop_condition": "completed",
            "trajectory": [
                {
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "assistant", "content": "a"},
                    ],
                    "num_input_tokens": 0,
                    "num_output_tokens": 0,
                }
            ],
            "token_usage": None,
            "info": {"log": "ok"},
            "correct": 1.0,
        }

    def test_a_minimal_trace_takes_every_default(self):
        sample = sample_of(trace(id="x", idx=0))

        assert sample == {
            "sample_id": "x",
            "example_id": 0,
            "rollout_number": 1,
            "task": {"idx": 0},
            "prompt": [],
            "completion": [],
            "answer": None,
            "reward": 0,
            "timing": {},
            "is_completed": False,
            "is_truncated": False,
            "metrics": {},
            "error": None,
            "stop_condition": None,
            "trajectory": [],
            "token_usage": None,
            "info": None,
        }

    def test_prompt_is_empty_even_when_the_task_has_one(self):
        t = trace(nodes=[node("q", role="user")])
        t["task"]["prompt"] = [{"role": "user", "content": "q"}]

        assert sample_of(t)["prompt"] == []

    def test_null_keys_of_the_task_are_dropped(self):
        t = trace()
        t["task"].update(prompt=None, answer=None, split="test")

        sample = sample_of(t)

        assert sample["task"] == {"idx": 0, "split": "test"}
        assert sample["answer"] is None

    def test_empty_info_is_null(self):
        assert sample_of(trace(info={}))["info"] is None

    def test_each_reward_is_also_a_top_level_key(self):
        sample = sample_of(trace(rewards={"correct": 1.0, "format": 0.5}))

        assert set(sample) == CORE_KEYS | {"correct", "format"}
        assert (sample["correct"], sample["format"]) == (1.0, 0.5)

    def test_a_reward_named_like_a_core_key_does_not_overwrite_it(self):
        t = trace(info={"k": "v"}, rewards={"reward": 0.25, "info": 0.5, "task": 0.125, "x": 1.0})

        sample = sample_of(t)

        assert sample["reward"] == 1.875
        assert sample["info"] == {"k": "v"}
        assert sample["task"] == {"idx": 0}
        assert sample["x"] == 1.0
        assert set(sample) == CORE_KEYS | {"x"}

    def test_metrics_stay_nested_and_are_not_flattened(self):
        sample = sample_of(trace(metrics={"turns": 3.0}))

        assert sample["metrics"] == {"turns": 3.0}
        assert "turns" not in sample

    def test_unknown_trace_keys_are_ignored(self):
        sample = sample_of(trace(new_field_of_a_later_producer={"x": 1}, state={"y": 2}))

        assert set(sample) == CORE_KEYS


class TestRolloutNumbers:
    def test_rollouts_are_counted_per_task_in_file_order_with_interleaved_tasks(self, tmp_path):
        idxs = [0, 1, 0, 2, 1, 0]
        raw = [orjson.dumps(trace(id=f"t{i}", idx=idx)) for i, idx in enumerate(idxs)]

        items, _ = convert_file(tmp_path / "traces.jsonl", raw)

        samples = [orjson.loads(item.sample) for item in items]
        assert [(s["example_id"], s["rollout_number"]) for s in samples] == [
            (0, 1),
            (1, 1),
            (0, 2),
            (2, 1),
            (1, 2),
            (0, 3),
        ]

    def test_a_bad_line_takes_no_rollout_number(self, tmp_path):
        raw = [orjson.dumps(trace(id="a")), b"{not json", orjson.dumps(trace(id="b"))]

        items, _ = convert_file(tmp_path / "traces.jsonl", raw)

        numbers = [
            orjson.loads(i.sample)["rollout_number"] for i in items if isinstance(i, Converted)
        ]
        assert numbers == [1, 2]


# ---------------------------------------------------------------- section 6: aggregates


def totals_of(*traces: dict[str, Any]) -> RunTotals:
    totals = RunTotals()
    for t in traces:
        totals.add(checked(t))
    return totals


class TestAggregates:
    def test_no_traces_gives_zero_averages_and_no_metrics(self):
        assert RunTotals().metrics() == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}

    def test_avg_reward_is_the_mean_of_the_trace_rewards(self):
        totals = totals_of(
            trace(rewards={"a": 1.0, "b": 0.5}), trace(rewards={}), trace(rewards={"a": 0.25})
        )

        assert totals.metrics()["avg_reward"] == pytest.approx(1.75 / 3)

    def test_avg_error_is_the_fraction_of_traces_with_an_error(self):
        error = {"type": "E", "message": "m"}
        totals = totals_of(trace(errors=[error]), trace(), trace(errors=[error, error]), trace())

        assert totals.metrics()["avg_error"] == 0.5

    def test_a_metric_wins_over_a_reward_of_the_same_name_within_a_trace(self):
        totals = totals_of(trace(rewards={"acc": 1.0}, metrics={"acc": 0.0}))

        assert totals.metrics()["avg_metrics"] == {"acc": 0.0}
        assert totals.metrics()["avg_reward"] == 1.0

    def test_each_name_is_averaged_over_the_traces_that_recorded_it(self):
        totals = totals_of(
            trace(rewards={"correct": 1.0}, metrics={"turns": 10.0}),
            trace(rewards={"correct": 0.0}),
            trace(rewards={"correct": 1.0}, metrics={"turns": 20.0}),
        )

        assert totals.metrics()["avg_metrics"] == {"correct": 2 / 3, "turns": 15.0}

    def test_metadata_and_name_follow_the_run_and_count_distinct_tasks(self):
        totals = totals_of(
            trace(idx=4, rewards={"r": 1.0}),
            trace(idx=9, rewards={"r": 0.0}, errors=[{"type": "E", "message": "m"}]),
            trace(idx=4, rewards={"r": 0.5}),
        )

        result = summary(a_run(env_name="gsm8k", model="org/model", num_rollouts=2), totals)

        metrics = {"avg_reward": 0.5, "avg_metrics": {"r": 0.5}, "avg_error": 1 / 3}
        assert result["name"] == "gsm8k--org/model--0f1e2d3c"
        assert result["metadata"] == {
            "framework": "verifiers",
            "run_id": RUN_ID,
            "model": "org/model",
            "num_examples": 2,
            "rollouts_per_example": 2,
            **metrics,
        }
        assert result["metrics"] == metrics


def some_traces() -> list[dict[str, Any]]:
    return [
        trace(
            id=f"t{i}",
            idx=i % 3,
            rewards={"a": 0.1 * i, "b": 1 / 3},
            metrics={"m": i / 7},
            errors=[{"type": "E", "message": "m"}] if i % 4 == 0 else [],
        )
        for i in range(10)
    ]


class TestRunTotalsPersistence:
    def test_the_json_round_trip_keeps_every_sum_exactly(self):
        totals = totals_of(*some_traces())

        restored = RunTotals.from_json(totals.to_json())

        assert restored == totals
        assert restored.metrics() == totals.metrics()

    def test_totals_resumed_from_json_end_where_one_pass_ends(self):
        traces = some_traces()
        one_pass = RunTotals()
        numbers = [one_pass.add(checked(t)) for t in traces]

        first = totals_of(*traces[:4])
        resumed = RunTotals.from_json(first.to_json())
        resumed_numbers = [resumed.add(checked(t)) for t in traces[4:]]

        assert resumed == one_pass
        assert resumed.metrics() == one_pass.metrics()
        assert resumed_numbers == numbers[4:]

    def test_a_non_finite_sum_survives_the_json_round_trip(self):
        totals = RunTotals(
            traces=1,
            reward_sum=math.nan,
            metric_sums={"r": math.nan, "up": math.inf, "down": -math.inf},
            metric_counts={"r": 1, "up": 1, "down": 1},
        )

        restored = RunTotals.from_json(totals.to_json())
        restored.add(checked(trace(rewards={"r": 1.0}, metrics={"up": 1.0, "down": 1.0})))

        assert math.isnan(restored.reward_sum)
        assert math.isnan(restored.metric_sums["r"])
        assert (restored.metric_sums["up"], restored.metric_sums["down"]) == (math.inf, -math.inf)
        assert restored.metric_counts == {"r": 2, "up": 2, "down": 2}


# ---------------------------------------------------------------- not-finite numbers


class TestNonFinite:
    def test_nan_and_infinity_literals_are_accepted_and_sent_as_null(self, tmp_path):
        raw = (
            b'{"id": "a", "task": {"idx": 0}, "rewards": {"r": NaN},'
            b' "metrics": {"m": Infinity, "n": -Infinity}}'
        )

        items, totals = convert_file(tmp_path / "traces.jsonl", [raw])

        assert [type(i) for i in items] == [Converted]
        sample = orjson.loads(items[0].sample)
        assert (sample["reward"], sample["r"]) == (None, None)
        assert sample["metrics"] == {"m": None, "n": None}
        assert totals.traces == 1

    def test_a_nan_literal_in_a_message_is_dropped_like_a_null(self, tmp_path):
        raw = orjson.dumps(trace(id="n", nodes=[node("hi")])).replace(
            b'"content":"hi"', b'"content":"hi","score":NaN'
        )

        [item], _ = convert_file(tmp_path / "traces.jsonl", [raw])

        assert orjson.loads(item.sample)["completion"] == [{"role": "assistant", "content": "hi"}]

    @pytest.mark.parametrize("literal", [b"Infinity", b"-Infinity"])
    def test_an_infinity_literal_in_an_error_or_timing_is_dropped_like_a_null(
        self, tmp_path, literal
    ):
        raw = orjson.dumps(
            trace(id="i", errors=[{"error": "E", "code": 1}], timing={"total": 1.0, "model": 2.0})
        )
        raw = raw.replace(b'"code":1', b'"code":' + literal).replace(
            b'"model":2.0', b'"model":' + literal
        )

        [item], _ = convert_file(tmp_path / "traces.jsonl", [raw])

        sample = orjson.loads(item.sample)
        assert (sample["error"], sample["timing"]) == ({"error": "E"}, {"total": 1.0})

    def test_a_line_without_null_passes_its_messages_through_byte_for_byte(self, tmp_path):
        # no null anywhere: no message is searched for one, each goes out exactly as written
        raw = orjson.dumps(trace(id="b", nodes=[node("say hi, \u00e9")])).replace(
            b'"content":', b'"content" :'
        )
        assert b"null" not in raw

        [item], _ = convert_file(tmp_path / "traces.jsonl", [raw])

        assert b'{"role":"assistant","content" :"say hi, \xc3\xa9"}' in item.sample

    def test_a_null_reward_counts_as_nan_and_is_sent_as_null(self, tmp_path):
        raw = orjson.dumps(trace(rewards={"r": None, "s": 1.0}))

        items, totals = convert_file(tmp_path / "traces.jsonl", [raw])

        sample = orjson.loads(items[0].sample)
        assert (sample["reward"], sample["r"], sample["s"]) == (None, None, 1.0)
        assert math.isnan(totals.reward_sum)

    def test_non_finite_aggregates_go_out_as_null(self):
        totals = totals_of(trace(rewards={"r": math.nan}), trace(rewards={"r": 1.0}))

        sent_summary = orjson.loads(orjson.dumps(summary(a_run(), totals)))

        assert sent_summary["metrics"] == {
            "avg_reward": None,
            "avg_metrics": {"r": None},
            "avg_error": 0.0,
        }


# ---------------------------------------------------------------- bad lines


def deeply_nested(depth: int) -> bytes:
    return (
        b'{"id": "a", "task": {"idx": 0}, "timing": '
        + b'{"a": ' * depth
        + b"1"
        + b"}" * depth
        + b"}"
    )


def encoded(**fields: Any) -> bytes:
    return orjson.dumps(trace(id="bad", **fields))


BAD_LINES = [
    ("invalid JSON", b'{"id": "a", oops}', "invalid JSON"),
    ("truncated JSON", b'{"id": "a", "task": {"idx": 0', "invalid JSON"),
    ("non-UTF-8 bytes", b'{"id": "\xff\xfe", "task": {"idx": 0}}', "not UTF-8"),
    ("a JSON array", b'[{"id": "a", "task": {"idx": 0}}]', "an array, not a JSON object"),
    ("a JSON string", b'"a trace"', "a string, not a JSON object"),
    ("a JSON number", b"42", "not a JSON object"),
    ("missing id", orjson.dumps({"task": {"idx": 0}}), "missing 'id'"),
    ("an id that is not a string", orjson.dumps({"id": 7, "task": {"idx": 0}}), "'id' must be"),
    ("missing task", orjson.dumps({"id": "a"}), "missing 'task'"),
    ("missing task.idx", orjson.dumps({"id": "a", "task": {"prompt": "q"}}), "missing 'task.idx'"),
    (
        "idx a string",
        orjson.dumps({"id": "a", "task": {"idx": "3"}}),
        "'task.idx' must be an integer",
    ),
    (
        "idx a bool",
        orjson.dumps({"id": "a", "task": {"idx": True}}),
        "'task.idx' must be an integer",
    ),
    ("rewards not a dict", encoded(rewards=[1.0]), "'rewards' must be an object"),
    (
        "a reward not a number",
        encoded(rewards={"r": "high"}),
        "a value in 'rewards' must be a number",
    ),
    ("metrics not a dict", encoded(metrics=3), "'metrics' must be an object"),
    ("nodes not a list", encoded(nodes={"0": {}}), "'nodes' must be a list"),
    ("a node not an object", encoded(nodes=["hi"]), "'nodes[0]'"),
    (
        "a node without a message",
        encoded(nodes=[{"parent": None}]),
        "missing 'nodes[0].message'",
    ),
    (
        "token_ids not a list",
        encoded(nodes=[node(token_ids=5)]),
        "'nodes[0].token_ids' must be a list",
    ),
    ("usage not an object", encoded(nodes=[node(usage=3)]), "'nodes[0].usage' must be an object"),
    (
        "usage tokens not ints",
        encoded(nodes=[node(usage=usage("1", 2))]),
        "'nodes[0].usage.prompt_tokens'",
    ),
    (
        "parent out of range",
        encoded(nodes=[node(), node(parent=5)]),
        "'nodes[1].parent' 5 is out of range",
    ),
    (
        "a negative parent",
        encoded(nodes=[node(), node(parent=-1)]),
        "'nodes[1].parent' -1 is out of range",
    ),
    ("a parent that is a string", encoded(nodes=[node(), node(parent="0")]), "'nodes[1].parent'"),
    ("a 2-cycle with no leaves", encoded(nodes=[node(parent=1), node(parent=0)]), "cycle"),
    ("a self-loop", encoded(nodes=[node(), node(parent=1)]), "cycle"),
    (
        "a cycle behind a leaf",
        encoded(nodes=[node(parent=1), node(parent=2), node(parent=1)]),
        "cycle",
    ),
    ("errors not a list", encoded(errors={"type": "E"}), "'errors' must be a list"),
    ("an error not an object", encoded(errors=["boom"]), "'errors[0]' must be an object"),
    ("info not a dict", encoded(info=["x"]), "'info' must be an object"),
    ("timing not a dict", encoded(timing=1.0), "'timing' must be an object"),
    ("stop_condition not a string", encoded(stop_condition=1), "'stop_condition' must be a string"),
    ("nesting past the decoder's limit", deeply_nested(2000), "nested too deeply"),
    ("nesting past the lenient parser's limit", deeply_nested(20000), "nested too deeply"),
]


class TestBadLines:
    @pytest.mark.timeout(10)
    @pytest.mark.parametrize(
        "raw, reason", [b[1:] for b in BAD_LINES], ids=[b[0] for b in BAD_LINES]
    )
    def test_a_bad_line_is_set_aside_with_where_and_why_and_the_rest_converts(
        self, tmp_path, raw, reason
    ):
        before, after = orjson.dumps(trace(id="before")), orjson.dumps(trace(id="after"))

        items, totals = convert_file(tmp_path / "traces.jsonl", [before, raw, after])

        assert [type(i) for i in items] == [Converted, SetAside, Converted]
        assert items[1].line == 2
        assert items[1].offset == len(before) + 1
        assert items[1].size == len(raw) + 1
        assert reason in items[1].reason
        assert [orjson.loads(i.sample)["sample_id"] for i in (items[0], items[2])] == [
            "before",
            "after",
        ]
        assert totals.traces == 2

    def test_a_line_over_max_line_bytes_is_set_aside_naming_the_limit(self, tmp_path):
        good = orjson.dumps(trace(id="good"))
        huge = orjson.dumps(trace(id="huge", info={"blob": "x" * 200}))

        items, totals = convert_file(tmp_path / "traces.jsonl", [huge, good], max_line_bytes=100)

        assert items[0] == SetAside(
            1,
            0,
            len(huge) + 1,
            SetAsideKind.BAD_LINE,
            "line longer than read.max_line_bytes (100 bytes)",
        )
        assert orjson.loads(items[1].sample)["sample_id"] == "good"
        assert totals.traces == 1

    def test_a_100_mb_line_is_set_aside_in_bounded_memory_and_the_run_goes_on(self, tmp_path):
        path = tmp_path / "traces.jsonl"
        first, last = orjson.dumps(trace(id="first")), orjson.dumps(trace(id="last", idx=1))
        block = b"x" * MIB
        with path.open("wb") as f:
            f.write(first + b'\n{"id": "huge", "info": {"blob": "')
            for _ in range(100):
                f.write(block)
            f.write(b'"}}\n' + last + b"\n")
        del block
        totals = RunTotals()

        tracemalloc.start()
        try:
            lines = read_lines(path, max_line_bytes=MIB)
            items = list(convert_lines(lines, totals, max_line_bytes=MIB))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

        assert [type(i) for i in items] == [Converted, SetAside, Converted]
        assert (items[1].line, items[1].offset) == (2, len(first) + 1)
        assert items[1].size > 100 * MIB
        assert "max_line_bytes" in items[1].reason
        assert totals.traces == 2
        assert peak < 5 * MIB, f"peak {peak / MIB:.1f} MiB: the long line was held"

    def test_an_empty_traces_file_converts_to_nothing(self, tmp_path):
        items, totals = convert_file(tmp_path / "traces.jsonl", [])

        assert items == []
        assert totals.metrics() == {"avg_reward": 0.0, "avg_metrics": {}, "avg_error": 0.0}

    def test_a_blank_line_is_no_record_and_not_set_aside(self, tmp_path):
        raw = [orjson.dumps(trace(id="a")), b"", b"   ", orjson.dumps(trace(id="b"))]

        items, totals = convert_file(tmp_path / "traces.jsonl", raw)

        assert [orjson.loads(i.sample)["sample_id"] for i in items] == ["a", "b"]
        assert items[1].line.number == 4
        assert totals.traces == 2


class TestScanAgreesWithConversion:
    """The cheap first pass and the conversion take and refuse exactly the same lines."""

    HARD_LINES = [
        b'{"id": "s", "task": {"idx": 0}, "info": {"s": "\\ud800"}}',  # lone surrogate: refused
        deeply_nested(150),  # deep, taken
        b'{"id": "n", "task": {"idx": 0}, "rewards": {"r": NaN}}',  # not JSON, taken
        deeply_nested(2000),  # too deep: refused
        deeply_nested(950),  # deep, taken
        b'{"id": "ok", "task": {"idx": 1}, "rewards": {"r": 1.0}}',
    ]

    def _lines(self, tmp_path: Path) -> Path:
        path = tmp_path / "traces.jsonl"
        path.write_bytes(b"\n".join(self.HARD_LINES) + b"\n")
        return path

    @pytest.mark.timeout(10)
    def test_hard_lines_that_are_taken_convert_to_strict_json(self, tmp_path: Path) -> None:
        path = self._lines(tmp_path)
        lines = read_lines(path, max_line_bytes=MIB)
        items = list(convert_lines(lines, RunTotals(), max_line_bytes=MIB))
        converted = [i for i in items if isinstance(i, Converted)]
        assert [i.line.number for i in converted] == [2, 3, 5, 6]
        for item in converted:
            json.loads(item.sample)  # strict JSON: no NaN literal
        assert json.loads(converted[1].sample)["reward"] is None

    @pytest.mark.timeout(10)
    def test_scan_counts_exactly_the_lines_conversion_sends(self, tmp_path: Path) -> None:
        path = self._lines(tmp_path)
        totals = RunTotals()
        lines = read_lines(path, max_line_bytes=MIB)
        items = list(convert_lines(lines, totals, max_line_bytes=MIB))
        found = scan(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)
        refused = [i.line for i in items if isinstance(i, SetAside)]
        assert [s.line for s in found.set_aside] == refused == [1, 4]
        assert found.totals.to_json() == totals.to_json()
        assert found.end == path.stat().st_size

    @pytest.mark.timeout(10)
    @pytest.mark.parametrize("depth", [0, 700])
    def test_how_deep_the_callers_stack_is_changes_no_line_taken_or_refused(
        self, tmp_path: Path, depth: int
    ) -> None:
        # A line nesting 950 levels fits Python's recursion limit only from a shallow stack;
        # the same file must give the same samples wherever it is read from (an upload thread,
        # the tracker, a test runner's deep stack).
        path = self._lines(tmp_path)

        def at_depth(left: int, work: Callable[[], Any]) -> Any:
            return work() if left == 0 else at_depth(left - 1, work)

        def convert() -> list[int]:
            lines = read_lines(path, max_line_bytes=MIB)
            items = list(convert_lines(lines, RunTotals(), max_line_bytes=MIB))
            return [i.line.number for i in items if isinstance(i, Converted)]

        def scanned() -> list[int]:
            found = scan(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)
            return [s.line for s in found.set_aside]

        assert at_depth(depth, convert) == [2, 3, 5, 6]
        assert at_depth(depth, scanned) == [1, 4]

    @pytest.mark.timeout(10)
    def test_a_deep_timing_holding_nulls_converts_from_a_deep_stack(self, tmp_path: Path) -> None:
        # Nulls are dropped from timing at every depth, one Python frame a level.
        deep = deeply_nested(800).replace(b": 1}", b': 1, "b": null}', 1)
        path = tmp_path / "traces.jsonl"
        path.write_bytes(deep + b"\n")

        def at_depth(left: int) -> list[Converted | SetAside]:
            if left:
                return at_depth(left - 1)
            lines = read_lines(path, max_line_bytes=MIB)
            return list(convert_lines(lines, RunTotals(), max_line_bytes=MIB))

        items = at_depth(500)
        assert [type(i) for i in items] == [Converted]
        assert b'"b"' not in items[0].sample


# Lines bad only in what the tally skips: it takes them, and conversion sets them aside.
BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK = {
    "non-UTF-8 in a message": encoded(nodes=[node("hi")]).replace(b'"hi"', b'"\xff"'),
    "nodes not a list": encoded(nodes={"0": {}}),
    "sampled not a bool": encoded(nodes=[node(sampled="yes")]),
    "parent out of range": encoded(nodes=[node(), node(parent=5)]),
    "a cycle": encoded(nodes=[node(parent=1), node(parent=0)]),
    "an error not an object": encoded(errors=["boom"]),
    "info not a dict": encoded(info=["x"]),
}


def _refusal(decode: Any, raw: bytes) -> str | None:
    try:
        decode(raw, 1)
    except BadRecord as exc:
        return exc.reason
    return None


class TestTheTally:
    """The cheap first pass: decodes only what the totals need, and never refuses a line that
    conversion would take."""

    @pytest.mark.timeout(10)
    @pytest.mark.parametrize(
        "raw",
        [b[1] for b in BAD_LINES] + TestScanAgreesWithConversion.HARD_LINES,
        ids=[b[0] for b in BAD_LINES] + [f"hard {i}" for i in range(6)],
    )
    def test_a_line_the_tally_refuses_is_refused_by_the_full_check_for_the_same_reason(
        self, raw: bytes
    ) -> None:
        cheap, full = _refusal(decode_tally, raw), _refusal(decode_trace, raw)
        if cheap is not None:
            assert cheap == full

    @pytest.mark.parametrize(
        "name",
        [
            "invalid JSON",
            "truncated JSON",
            "non-UTF-8 bytes",
            "a JSON array",
            "missing id",
            "an id that is not a string",
            "missing task",
            "missing task.idx",
            "idx a string",
            "idx a bool",
            "rewards not a dict",
            "a reward not a number",
            "metrics not a dict",
            "errors not a list",
            "nesting past the decoder's limit",
        ],
    )
    def test_a_line_bad_in_what_the_tally_reads_is_refused_by_it(self, name: str) -> None:
        [(raw, reason)] = [b[1:] for b in BAD_LINES if b[0] == name]
        assert reason in (_refusal(decode_tally, raw) or "taken")

    @pytest.mark.parametrize(
        "raw",
        BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK.values(),
        ids=BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK.keys(),
    )
    def test_a_line_bad_only_where_the_tally_does_not_look_is_counted_by_it_and_refused_later(
        self, raw: bytes
    ) -> None:
        assert _refusal(decode_tally, raw) is None
        assert _refusal(decode_trace, raw) is not None

    @pytest.mark.timeout(60)
    def test_no_mangled_line_is_refused_by_the_tally_and_taken_by_the_full_check(self, tmp_path):
        """Thousands of random one-edit corruptions of realistic lines (a byte dropped, doubled
        or replaced by JSON punctuation, a digit, a letter or a non-UTF-8 byte)."""
        gen = gen_traces()
        lines = (gen.generate(tmp_path, 60_000, seed=9) / "traces.jsonl").read_bytes().split()
        rng = random.Random(10)
        edits = [b"", b"{", b"}", b"[", b"]", b",", b":", b'"', b"1", b"-", b"x", b"\xff", b"null"]
        tried = refused_by_both = 0
        for _ in range(MANGLED_LINES):
            raw = rng.choice(lines)
            at = rng.randrange(len(raw))
            edit = rng.choice([*edits, raw[at : at + 1] * 2])
            mangled = raw[:at] + edit + raw[at + 1 :]
            cheap, full = _refusal(decode_tally, mangled), _refusal(decode_trace, mangled)
            tried += 1
            if cheap is not None:
                assert full is not None, (mangled, cheap)
                refused_by_both += 1
        assert tried == MANGLED_LINES and refused_by_both > MANGLED_LINES // 10

    def test_the_tally_of_a_good_run_is_the_checked_scan_exactly(self, tmp_path: Path) -> None:
        gen = gen_traces()
        run_dir = gen.generate(tmp_path, 400_000, seed=5)
        path = run_dir / "traces.jsonl"
        with path.open("ab") as f:  # non-finite and null scores, an idx only seen once
            f.write(b'{"id": "n", "task": {"idx": 9999}, "rewards": {"r": NaN}, "metrics": {}}\n')
            f.write(orjson.dumps(trace(id="m", idx=3, rewards={"r": None}, errors=[{}])) + b"\n")

        checked = scan(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)
        cheap = tally(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)

        assert checked.totals.traces > 100 and not checked.set_aside
        assert cheap.totals.to_json() == checked.totals.to_json()
        assert cheap.end == checked.end == path.stat().st_size
        assert cheap.set_aside == []

    def test_the_tally_sets_aside_what_it_refuses_and_counts_the_rest(self, tmp_path) -> None:
        path = tmp_path / "traces.jsonl"
        good = [orjson.dumps(trace(id=f"g{i}", idx=i, rewards={"r": 1.0})) for i in range(3)]
        late = BAD_ONLY_WHERE_THE_TALLY_DOES_NOT_LOOK["parent out of range"]
        path.write_bytes(b"\n".join([good[0], b"{oops", good[1], late, b"", good[2]]) + b"\n")

        cheap = tally(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)
        checked = scan(read_lines(path, max_line_bytes=MIB), max_line_bytes=MIB)

        assert [item.line for item in cheap.set_aside] == [2]
        assert [item.line for item in checked.set_aside] == [2, 4]
        assert (cheap.totals.traces, checked.totals.traces) == (4, 3)


class TestRawFieldsAreValidText:
    """Messages and info pass through raw, so their bytes are checked before they go out."""

    @pytest.mark.parametrize("where", ["message", "info"])
    def test_invalid_utf8_inside_a_raw_field_sets_the_line_aside(self, tmp_path, where):
        good = orjson.dumps(trace(id="good", nodes=[node("hi")], info={"k": "v"}))
        bad = good.replace(b'"hi"' if where == "message" else b'"v"', b'"\xff\xfe"')

        items, totals = convert_file(tmp_path / "traces.jsonl", [good, bad])

        assert [type(i) for i in items] == [Converted, SetAside]
        assert "not UTF-8" in items[1].reason
        assert totals.traces == 1


class TestRolloutCounter:
    """Rollout numbers per task idx, dense or not."""

    def test_counts_per_task_and_distinct_tasks_for_every_kind_of_idx(self):
        counter = RolloutCounter()
        idxs = [0, 5, 0, -3, 10**12, 5, 0, -3]

        numbers = [counter.add(idx) for idx in idxs]

        assert numbers == [1, 1, 2, 1, 1, 2, 3, 2]
        assert len(counter) == 4
        assert (counter.count(0), counter.count(7), counter.count(-3)) == (3, 0, 2)

    def test_a_counter_rebuilt_from_its_items_is_equal_and_counts_on(self):
        counter = RolloutCounter()
        for idx in [3, 1, 3, -1, 2**40]:
            counter.add(idx)

        rebuilt = RolloutCounter(counter.items())

        assert rebuilt == counter and len(rebuilt) == 4
        assert rebuilt.add(3) == counter.add(3) == 3


def test_a_rollout_counter_survives_its_json_state_with_dense_and_sparse_tasks():
    counter = RolloutCounter()
    for idx in [0, 0, 7, -2, 2**40, 7, 3]:
        counter.add(idx)

    restored = RolloutCounter.from_state(
        msgspec.json.decode(msgspec.json.encode(counter.to_state()))
    )

    assert restored == counter and len(restored) == len(counter) == 5
    assert restored.add(7) == 3


def test_a_run_of_75000_tasks_saves_its_rollout_counts_in_a_few_hundred_bytes():
    """The state rides in the ledger's run row, rewritten whole at each of a batch's writes."""
    counter = RolloutCounter()
    for _ in range(4):
        for idx in range(75_000):
            counter.add(idx)

    state = msgspec.json.encode(counter.to_state())
    restored = RolloutCounter.from_state(msgspec.json.decode(state))

    assert len(state) < 1024
    assert restored == counter and len(restored) == 75_000
    assert restored.add(74_999) == 5


@pytest.mark.parametrize("tasks", [1, 64, 65, 300])
def test_a_rollout_counter_saves_few_counts_raw_and_more_deflated(tasks):
    """Deflating a few bytes costs zlib's whole set-up (a tenth of a one-trace run's CPU)."""
    counter = RolloutCounter()
    for idx in range(tasks):
        counter.add(idx)
        counter.add(idx)

    state = counter.to_state()
    restored = RolloutCounter.from_state(msgspec.json.decode(msgspec.json.encode(state)))

    raw_bytes = 4 * len(counter._dense)  # the flat array grows by doubling
    assert ("dense" in state) == (raw_bytes <= 256) != ("dense_deflated" in state)
    assert restored == counter and len(restored) == tasks
    assert restored.add(tasks - 1) == 3


def test_a_rollout_counter_reads_the_raw_dense_state_an_older_evalpush_wrote():
    counts = array.array("I", [2, 0, 1])
    older = {"dense": base64.b64encode(counts.tobytes()).decode(), "sparse": [[-4, 3]]}

    restored = RolloutCounter.from_state(older)

    assert restored.items() == [(0, 2), (2, 1), (-4, 3)] and len(restored) == 3
    assert restored.add(0) == 3
