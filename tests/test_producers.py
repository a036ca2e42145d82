"""The later producers, verifiers 0.2.1, 0.3.1 and 0.4.0: their run directories, written by
their own writers, convert to the samples and aggregates their own pushes sent.

`tests/fixtures/producers/<version>/` is made by `tools/make_fixtures.py` (`tools/producers.py`
inside each version's own venv): `runs/<case>/<run dir>/` as the version wrote it, and
`recorded/<case>.json` with the requests its push made (0.4.0 online: prime-runs with the legacy
samples endpoint; offline: prime-runs' own projection, nothing being sent).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from evalpush.convert import Converted, RunTotals, convert_lines, scan, tally
from evalpush.runs import read_lines
from pushing import as_the_eval_sends
from test_fixtures import differences

PRODUCERS = Path(__file__).parent / "fixtures" / "producers"
RECORDED = sorted(PRODUCERS.glob("*/recorded/*.json"))
MIB = 1024 * 1024
UPLOADED = (0, 4)
"""`push`'s exit when every run is uploaded: 4 when some is partial (the recorded 0.3 and 0.4
runs hold 4 of the 6 traces their config expects)."""


def case_id(path: Path) -> str:
    return f"{path.parents[1].name}-{path.stem}"


def recording(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def run_dir(path: Path) -> Path:
    return path.parents[1] / recording(path)["run_dir"]


def sent(record: dict[str, Any]) -> tuple[list[dict], dict[str, Any] | None]:
    """The samples the producer sent, in order, and the metrics its finalize carried."""
    if "projected" in record:
        return record["projected"]["samples"], record["projected"]["metrics"]
    samples, metrics = [], None
    for request in record["requests"]:
        if request["path"].endswith("/samples"):
            samples += request["body"]["samples"]
        elif request["path"].endswith("/finalize"):
            metrics = request["body"]["metrics"]
    return samples, metrics


def converted(directory: Path) -> tuple[list[dict], RunTotals]:
    totals = RunTotals()
    lines = read_lines(directory / "traces.jsonl", max_line_bytes=MIB)
    items = list(convert_lines(lines, totals, max_line_bytes=MIB))
    refused = [item for item in items if not isinstance(item, Converted)]
    assert refused == [], refused
    return [json.loads(item.sample) for item in items], totals


def test_every_later_producer_has_its_fixtures():
    assert sorted({p.parents[1].name for p in RECORDED}) == ["0.2.1", "0.3.1", "0.4.0"]


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_samples_are_those_the_producers_own_push_sent(path: Path) -> None:
    want, _metrics = sent(recording(path))
    assert want, "the recording holds samples"

    got, _totals = converted(run_dir(path))

    assert [s["sample_id"] for s in got] == [s["sample_id"] for s in want]
    found = differences(want, got)
    assert not found, "\n".join(found[:40])


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_run_metrics_are_those_the_producers_own_push_sent(path: Path) -> None:
    _samples, want = sent(recording(path))
    assert want is not None

    _got, totals = converted(run_dir(path))

    metrics = totals.metrics()
    want = {k: v for k, v in want.items() if k != "prime_runs"}  # prime-runs' own bookkeeping
    found = differences(want, metrics)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_the_first_passes_total_the_run_as_conversion_does(path: Path) -> None:
    traces = run_dir(path) / "traces.jsonl"
    _got, totals = converted(run_dir(path))

    for first_pass in (tally, scan):
        found = first_pass(read_lines(traces, max_line_bytes=MIB), max_line_bytes=MIB)
        assert found.set_aside == []
        assert found.totals.to_json() == totals.to_json()
        assert RunTotals.from_json(found.totals.to_json()).metrics() == totals.metrics()


# ---------------------------------------------------------------- through `evalpush push`


def copy_run(path: Path, root: Path) -> Path:
    """The recorded run's directory copied under `root/<group>/` (its logs/latest symlink kept
    a symlink), as the producer left it."""
    source = run_dir(path)
    target = root / "group" / source.name
    shutil.copytree(source, target, symlinks=True)
    return target


def stored(platform, evaluation_id: str) -> list[dict]:
    return platform.samples(evaluation_id)


def api(platform, method: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {platform.api_key or 'any-key'}"}
    done = httpx.request(method, f"{platform.base_url}/api/v1{path}", json=body, headers=headers)
    done.raise_for_status()
    return done.json()


@pytest.mark.parametrize("path", RECORDED, ids=case_id)
def test_push_uploads_each_producers_run_once_as_its_own_push_did(
    path: Path, evalpush, platform, tmp_path: Path
) -> None:
    record = recording(path)
    want_samples, want_metrics = sent(record)
    directory = copy_run(path, tmp_path / "outputs")

    done = evalpush("push", str(tmp_path / "outputs"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    ((evaluation_id, evaluation),) = platform.summary()["evaluations"].items()
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)
    found = differences(want_samples, sorted_like(stored(platform, evaluation_id), want_samples))
    assert not found, "\n".join(found[:40])
    metrics = dict(evaluation["metrics"])
    if "projected" in record:  # prime-runs' aggregates alone: its bookkeeping is added at finish
        assert metrics.pop("prime_runs") == {"traces_episodes_written": 0}
    assert not differences(want_metrics, metrics)
    create = next(
        (r["body"] for r in record["requests"] if r["path"].endswith("/evaluations/")), None
    )
    if create is not None:
        assert evaluation["name"] == create["name"]
        # evalpush's one key, kept through a 0.4 run's update: every line seen (an episode is
        # one, with or without a trace), complete when they reach the expected count
        ours = evaluation["metadata"]["evalpush"]
        lines = len((directory / "traces.jsonl").read_bytes().splitlines())
        assert ours["seen_traces"] == lines
        assert ours["complete"] == (lines >= ours["expected_traces"])
        metadata = as_the_eval_sends(evaluation["metadata"])
        if path.parents[1].name == "0.4.0":
            # evalpush's one addition: the run id its own lookups find the evaluation by
            assert metadata.pop("run_id") == json.loads(done_run_id(directory))
        assert not differences(create["metadata"], metadata)
    if path.parents[1].name == "0.4.0":  # prime-runs' update before its finalize
        assert platform.summary()["requests"]["close"] == 1
    again = evalpush("push", str(tmp_path / "outputs"))
    assert again.returncode == 0 and "already finalized, nothing sent" in again.stdout
    assert len(platform.summary()["evaluations"]) == 1


def sorted_like(got: list[dict], want: list[dict]) -> list[dict]:
    order = {s["sample_id"]: i for i, s in enumerate(want)}
    return sorted(got, key=lambda s: order.get(s["sample_id"], len(order)))


def done_run_id(directory: Path) -> str:
    last = (directory / "traces.jsonl").read_bytes().splitlines()[-1]
    return json.dumps(json.loads(last)["run"]["id"])


ONLINE_0_4 = PRODUCERS / "0.4.0" / "recorded" / "episodes_v4_online.json"


def as_run_of(directory: Path, run_id: str) -> None:
    """The run's lines as if its eval had run against this platform: `run.id` is `run_id`."""
    lines = []
    for line in (directory / "traces.jsonl").read_bytes().splitlines():
        episode = json.loads(line)
        episode["run"]["id"] = run_id
        lines.append(json.dumps(episode, ensure_ascii=False).encode())
    (directory / "traces.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def producer_evaluation(platform, **changes: Any) -> str:
    """An evaluation as prime-runs opened the recorded run's before its first rollout (the
    recorded create, its environment resolved on `platform`), with `changes` to its body."""
    recorded = recording(ONLINE_0_4)["requests"]
    body = {**next(r["body"] for r in recorded if r["path"].endswith("/evaluations/")), **changes}
    env = api(platform, "POST", "/environmentshub/resolve", {"name": body["dataset"]})
    body["environments"] = [{"id": env["data"]["id"]}]
    return api(platform, "POST", "/evaluations/", body)["evaluation_id"]


def test_a_0_4_run_its_eval_pushed_and_finalized_is_adopted_and_nothing_is_sent(
    evalpush, platform, tmp_path: Path
) -> None:
    evaluation_id = producer_evaluation(platform)
    api(platform, "POST", f"/evaluations/{evaluation_id}/finalize", {"metrics": {}})  # samples
    # went to Prime Traces: the legacy table holds none, which is no reason to upload again
    directory = copy_run(ONLINE_0_4, tmp_path / "outputs")
    as_run_of(directory, evaluation_id)
    before = platform.summary()["requests"]

    done = evalpush("push", str(tmp_path / "outputs"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    after = platform.summary()
    assert list(after["evaluations"]) == [evaluation_id]
    assert after["evaluations"][evaluation_id]["sample_count"] == 0
    for kind in ("create", "samples", "finalize", "close"):
        assert after["requests"][kind] == before[kind], kind
    detail = evalpush("status", evaluation_id)
    assert "adopted the evaluation its eval pushed" in detail.stdout, detail.stdout


def test_a_0_4_run_whose_eval_died_mid_run_completes_the_evaluation_it_left_open(
    evalpush, platform, tmp_path: Path
) -> None:
    evaluation_id = producer_evaluation(platform)
    want, _metrics = sent(recording(ONLINE_0_4))
    directory = copy_run(ONLINE_0_4, tmp_path / "outputs")
    as_run_of(directory, evaluation_id)
    first = [dict(s, info=None) for s in want[:2]]  # what it streamed before it died
    api(platform, "POST", f"/evaluations/{evaluation_id}/samples", {"samples": first})

    done = evalpush("push", str(tmp_path / "outputs"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    after = platform.summary()
    assert list(after["evaluations"]) == [evaluation_id], "no second evaluation"
    evaluation = after["evaluations"][evaluation_id]
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)
    assert (evaluation["sample_count"], evaluation["duplicates"]) == (len(want), 0)
    assert evaluation["metadata"]["run_id"] == evaluation_id
    assert after["requests"]["close"] == 1  # the update before the finalize


@pytest.mark.parametrize(
    "changes",
    [
        {"metadata": {"owner": "another team"}, "name": "another team's evaluation"},
        {"model_name": "another/model"},
        {"dataset": "another-env"},
    ],
    ids=["another team's", "another model", "another environment"],
)
def test_a_0_4_run_naming_an_open_evaluation_that_is_not_its_own_leaves_it_untouched(
    evalpush, platform, tmp_path: Path, changes: dict[str, Any]
) -> None:
    """Someone else's open evaluation, named by the run's lines: nothing is written into it,
    its metadata stays, it is not finalized; the run uploads as a new evaluation, and `status
    RUN` names the one it set apart."""
    foreign = producer_evaluation(platform, **changes)
    before = platform.summary()["evaluations"][foreign]
    directory = copy_run(ONLINE_0_4, tmp_path / "outputs")
    as_run_of(directory, foreign)

    done = evalpush("push", str(tmp_path / "outputs"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    after = platform.summary()["evaluations"]
    assert after[foreign] == before, "someone else's evaluation is left exactly as it was"
    (new,) = set(after) - {foreign}
    assert after[new]["status"] == "COMPLETED" and after[new]["metadata"]["run_id"] == foreign
    detail = evalpush("status", foreign)
    assert "not the run's" in detail.stdout and foreign in detail.stdout, detail.stdout


def test_a_0_4_run_naming_another_runs_evaluation_is_uploaded_as_its_own(
    evalpush, platform, tmp_path: Path
) -> None:
    """Run A uploaded as evaluation E; run B's lines say `run.id = E`: B's episodes go to a new
    evaluation of B's, and E keeps A's samples alone."""
    first = copy_run(ONLINE_0_4, tmp_path / "a")
    as_run_of(first, "disabled-0123456789abcdef")
    assert evalpush("push", str(tmp_path / "a")).returncode in UPLOADED
    ((taken, held),) = platform.summary()["evaluations"].items()
    second = copy_run(ONLINE_0_4, tmp_path / "b")
    as_run_of(second, taken)

    done = evalpush("push", str(tmp_path / "b"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    after = platform.summary()["evaluations"]
    assert after[taken] == held, "A's evaluation is left as A's upload finalized it"
    (new,) = set(after) - {taken}
    assert after[new]["sample_count"] == held["sample_count"]
    assert after[new]["metadata"]["run_id"] == taken


def test_an_offline_0_4_run_is_created_as_new_under_its_disabled_run_id(
    evalpush, platform, tmp_path: Path
) -> None:
    path = PRODUCERS / "0.4.0" / "recorded" / "episodes_v4_offline.json"
    directory = copy_run(path, tmp_path / "outputs")
    run_id = json.loads(done_run_id(directory))
    assert run_id.startswith("disabled-")

    done = evalpush("push", str(tmp_path / "outputs"))

    assert done.returncode in UPLOADED, done.stdout + done.stderr
    ((evaluation_id, evaluation),) = platform.summary()["evaluations"].items()
    assert evaluation_id != run_id and evaluation["metadata"]["run_id"] == run_id
    assert (evaluation["status"], evaluation["finalize_count"]) == ("COMPLETED", 1)


# ---------------------------------------------------------------- lines told apart, hostile lines


def convert_raw(tmp_path: Path, *lines: bytes) -> tuple[list, RunTotals]:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    totals = RunTotals()
    items = list(convert_lines(read_lines(path, max_line_bytes=MIB), totals, max_line_bytes=MIB))
    return items, totals


def episode(id: str = "e1", *traces: dict, ok: bool = True) -> dict:
    task = {"type": "T", "data": {"idx": 0}}
    return {
        "id": id,
        "task": task,
        "run": {"type": "eval", "id": "r"},
        "ok": ok,
        "traces": list(traces),
    }


def ep_trace(id: str = "t1", idx: int = 0, **fields: Any) -> dict:
    return {"id": id, "task": {"type": "T", "data": {"idx": idx}}, **fields}


def test_a_seed_line_naming_the_markers_only_inside_its_values_converts_as_the_seeds(tmp_path):
    line = {
        "id": "s1",
        "task": {"idx": 0, "prompt": 'say "traces": [] and "version": 2'},
        "info": {"version": 2, "traces": [1]},
        "rewards": {"r": 1.0},
    }
    items, totals = convert_raw(tmp_path, json.dumps(line).encode())

    [item] = items
    assert isinstance(item, Converted)
    assert json.loads(item.sample)["info"] == {"version": 2, "traces": [1]}
    assert totals.episodes == 0 and totals.traces == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"id": "e", "task": {}, "traces": {"0": {}}}, "'traces' must be a list"),
        ({**episode("e"), "ok": "yes"}, "'ok' must be a boolean"),
        (
            {"id": "v", "version": 2, "task": {"data": {"idx": 0}}, "calls": [{"node": "x"}]},
            "'calls[0].node' must be an integer",
        ),
        (episode("e", {"id": "t", "task": {"data": {}}}), "missing 'traces[0].task.data.idx'"),
        (episode("e", ep_trace(idx="3")), "'traces[0].task.idx' must be an integer"),
        (
            episode("e", ep_trace(nodes=[{"message": {}, "parent": 4}])),
            "'traces[0].nodes[0].parent' 4 is out of range",
        ),
        (episode("", ep_trace()), "'id' must be a non-empty string"),
        ({"id": "v", "version": 2, "task": {"idx": 0}}, "missing 'task.data'"),
        ({"id": "v", "version": 2, "task": {"data": {}}}, "missing 'task.data.idx'"),
        (
            {"id": "v", "version": 2, "task": {"data": {"idx": 0}}, "tools": "x"},
            "'tools' must be a list",
        ),
    ],
)
def test_a_bad_later_line_is_set_aside_naming_what_is_wrong(tmp_path, line, reason):
    items, totals = convert_raw(tmp_path, json.dumps(line).encode())

    [item] = items
    assert not isinstance(item, Converted)
    assert reason in item.reason, item.reason
    assert totals.traces == totals.episodes == 0


def test_an_episode_with_no_trace_sends_nothing_and_counts_as_an_error(tmp_path):
    good = episode("e1", ep_trace(rewards={"r": {"score": 1.0, "weight": 2.0}}))
    empty = episode("e2", ok=False)

    items, totals = convert_raw(tmp_path, json.dumps(good).encode(), json.dumps(empty).encode())

    [sample] = [json.loads(i.sample) for i in items]
    assert (sample["sample_id"], sample["reward"], sample["r"]) == ("e1", 2.0, 1.0)
    assert totals.metrics() == {"avg_reward": 2.0, "avg_metrics": {"r": 1.0}, "avg_error": 0.5}


def test_with_no_trainable_trace_the_aggregates_take_every_trace(tmp_path):
    judge = {"agent": {"name": "judge", "trainable": False}}
    line = episode(
        "e1",
        ep_trace("a", rewards={"r": {"score": 0.5}}, **judge),
        ep_trace("b", rewards={"r": {"score": 1.5}, "gone": None}, **judge),
    )

    items, totals = convert_raw(tmp_path, json.dumps(line).encode())

    sample = json.loads(items[0].sample)
    assert (sample["agent"], sample["trainable"], sample["info"]["native_trace_index"]) == (
        "judge",
        False,
        0,
    )
    assert "gone" not in sample
    assert totals.metrics()["avg_metrics"] == {"r": 1.0}


def test_the_native_wrapper_leaves_out_the_raw_tensors_as_the_producers_record_does(tmp_path):
    node = {"message": {"role": "user", "content": "hi"}, "routed_experts": {"__nd__": 1}}
    line = episode("e1", ep_trace(nodes=[node]))

    items, _totals = convert_raw(tmp_path, json.dumps(line).encode())

    wrapper = json.loads(items[0].sample)["info"]["native_wrapper"]
    assert wrapper["traces"][0]["nodes"][0] == {"message": {"role": "user", "content": "hi"}}
    assert wrapper["id"] == "e1"


# ---------------------------------------------------------------- found before its first line


@pytest.mark.parametrize("case", ["0.3.1/runs/episodes_v3", "0.4.0/runs/episodes_v4_offline"])
@pytest.mark.parametrize("restart", [False, True], ids=["watched", "daemon-restarted"])
def test_a_run_found_before_its_first_line_is_one_run_under_the_id_its_lines_carry(
    case: str, restart: bool, local_platform, tmp_path: Path
) -> None:
    """A 0.3/0.4 directory is not named by a UUID: until a whole line names the run, the daemon
    knows it by a stand-in. Once lines arrive (while it watches, or after a restart), the
    run takes their id: one ledger row, one evaluation, never a stand-in left waiting."""
    from daemon_support import RUN_STARTED, InProcessDaemon, daemon_environ, status

    source = next((PRODUCERS / case).iterdir())
    staged, tree = tmp_path / "staged", tmp_path / "outputs"
    shutil.copytree(source, staged, symlinks=True)
    lines = (staged / "traces.jsonl").read_bytes()
    half = len(lines.splitlines()[0]) // 2
    (staged / "traces.jsonl").write_bytes(lines[:half])  # the first rollout half-written
    run_id = json.loads(done_run_id_of(lines))
    (tree / "group").mkdir(parents=True)
    directory = tree / "group" / source.name
    environ = daemon_environ(local_platform, tmp_path, [tree], EVALPUSH_RUNS__SETTLE_SECONDS="5")

    with contextlib.ExitStack() as daemons:
        daemon = daemons.enter_context(InProcessDaemon(environ))
        daemon.wait_for(RUN_STARTED)
        os.utime(staged / "traces.jsonl")  # written just now: the settle time starts here
        staged.rename(directory)  # config written, no whole line yet
        found = daemon.wait_for("run found: waiting until it is finished")
        assert found["run"] != run_id
        if restart:
            assert daemon.stop() == 0
        with (directory / "traces.jsonl").open("ab") as out:
            out.write(lines[half:])
        if restart:
            daemon = daemons.enter_context(InProcessDaemon(environ)).started()
        daemon.wait_for("run finalized", run=run_id, timeout=30)
        rows = status(environ)
        assert daemon.stop() == 0

    assert list(rows) == [run_id], rows
    assert rows[run_id]["state"] == "finalized"
    ((evaluation, summary),) = local_platform.summary()["evaluations"].items()
    assert summary["finalize_count"] == 1


def done_run_id_of(lines: bytes) -> str:
    return json.dumps(json.loads(lines.splitlines()[-1])["run"]["id"])
