"""Compressed answers are inflated only up to their byte cap, however much they would inflate.

The local platform's `gzip_bomb` fault answers a body that inflates to 4 GiB (about 4 MiB as
one gzip, about 10 KB as a stacked `gzip, gzip`). Through the real client over loopback: a
write's answer is malformed (`Ambiguous`), a read's `Transient`, an error body is read only at
its start, and the memory it takes stays small. Through `evalpush push` in a subprocess whose
address space is bounded: the run is uploaded once, with no `MemoryError`. A compressed answer
within its cap is read as before (gzip, and deflate with or without its zlib wrapper).
"""

from __future__ import annotations

import gzip
import resource
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest

from daemon_support import trace_line
from evalpush.client import PlatformClient
from evalpush.config import PlatformConfig
from evalpush.core import errors
from evalpush.local_platform import LocalPlatform
from support.canned import CannedTransport
from support.environ import cli_environ
from support.runs import write_run

MEMORY_BOUND_BYTES = 16 * 1024 * 1024
"""What reading one bombed answer may take in this process (its cap is 1 MiB; httpx's decoder
inflated each 64 KiB read whole, up to 64 MiB at once)."""
CHILD_ADDRESS_SPACE_BYTES = 2 * 1024**3
"""The push's address space: a 4 GiB inflation cannot fit, so it would be a MemoryError."""
CHILD_RSS_BOUND_BYTES = 400 * 1024 * 1024
"""A sanity bound on the push's peak RSS (it runs in about 100 MB)."""
ENCODINGS = ["gzip", "gzip, gzip"]
TRACES = 12


def create_body(env_id: str) -> dict:
    return {
        "name": "gsm8k--m--bomb",
        "environments": [{"id": env_id}],
        "model_name": "m",
        "metadata": {"run_id": "run-bomb"},
        "metrics": {},
    }


def peak_of(call) -> tuple[BaseException | None, int]:
    """What `call` raised (None if nothing) and the most memory Python held meanwhile."""
    tracemalloc.start()
    try:
        try:
            call()
            raised = None
        except Exception as exc:  # noqa: BLE001 - handed to the test, which asserts its class
            raised = exc
        return raised, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def platform_client(make_platform_client: Callable[..., PlatformClient]) -> PlatformClient:
    """A client whose read timeout outlasts a bomb read to its cap under tracemalloc on a loaded
    box: what these tests judge is how the answer is classified, not a timeout."""
    return make_platform_client(read_timeout_seconds=60.0)


@pytest.mark.parametrize("encoding", ENCODINGS)
class TestThroughTheClient:
    def test_a_bombed_create_answer_is_malformed_and_never_inflated_past_its_cap(
        self, encoding: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ):
        env_id = platform_client.resolve_environment("gsm8k")
        local_platform.inject("gzip_bomb", on="create", status=200, encoding=encoding)

        raised, peak = peak_of(lambda: platform_client.create_evaluation(create_body(env_id)))

        assert isinstance(raised, errors.Ambiguous), raised
        assert peak < MEMORY_BOUND_BYTES, f"{peak / 2**20:.0f} MiB"

    def test_a_bombed_read_answer_is_transient_and_never_inflated_past_its_cap(
        self, encoding: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ):
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id = platform_client.create_evaluation(create_body(env_id))[0]
        local_platform.inject("gzip_bomb", on="read", status=200, encoding=encoding)

        raised, peak = peak_of(lambda: platform_client.get_evaluation(evaluation_id))

        assert isinstance(raised, errors.Transient), raised
        assert not isinstance(raised, errors.Ambiguous)
        assert peak < MEMORY_BOUND_BYTES, f"{peak / 2**20:.0f} MiB"

    def test_a_bombed_probe_answer_is_transient(
        self, encoding: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ):
        local_platform.inject("gzip_bomb", on="read", status=200, encoding=encoding)

        raised, peak = peak_of(platform_client.probe)

        assert isinstance(raised, errors.Transient), raised
        assert peak < MEMORY_BOUND_BYTES, f"{peak / 2**20:.0f} MiB"

    def test_a_bombed_error_body_is_read_only_at_its_start_and_the_status_stands(
        self, encoding: str, platform_client: PlatformClient, local_platform: LocalPlatform
    ):
        env_id = platform_client.resolve_environment("gsm8k")
        evaluation_id = platform_client.create_evaluation(create_body(env_id))[0]
        local_platform.inject("gzip_bomb", on="samples", status=422, encoding=encoding)
        batch = orjson.dumps({"samples": [{"sample_id": 1}]})

        raised, peak = peak_of(lambda: platform_client.push_samples(evaluation_id, batch))

        assert isinstance(raised, errors.BatchRefused) and raised.status == 422, raised
        assert peak < MEMORY_BOUND_BYTES, f"{peak / 2**20:.0f} MiB"


def canned_client(tmp_path: Path, answer: httpx.Response) -> PlatformClient:
    return PlatformClient(
        PlatformConfig(),
        environ={"PRIME_API_KEY": "k-canned-1", "PRIME_API_BASE_URL": "https://api.test"},
        home=tmp_path,
        transport=CannedTransport(lambda request: answer),
    )


def streamed(body: bytes, encoding: str) -> httpx.Response:
    """An answer as the wire hands it over: its body not read yet, nor decoded."""
    return httpx.Response(
        200, stream=httpx.ByteStream(body), headers={"Content-Encoding": encoding}
    )


ANSWER = {"id": "ev-1", "status": "RUNNING", "metadata": {"run_id": "r"}}


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw, without its zlib wrapper
        ("identity", lambda data: data),
    ],
    ids=["gzip", "deflate", "raw-deflate", "identity"],
)
def test_a_compressed_answer_within_its_cap_is_read(encoding, compress, tmp_path: Path):
    body = compress(orjson.dumps(ANSWER))
    answer = streamed(body, encoding)

    assert canned_client(tmp_path, answer).get_evaluation("ev-1").id == "ev-1"


@pytest.mark.parametrize("encoding", ["br", "gzip, deflate", "compress"])
def test_an_answer_in_a_coding_not_asked_for_is_malformed(encoding: str, tmp_path: Path):
    answer = streamed(b"{}", encoding)

    with pytest.raises(errors.Transient, match="not asked for"):
        canned_client(tmp_path, answer).get_evaluation("ev-1")


def test_a_gzip_answer_that_is_not_gzip_is_malformed(tmp_path: Path):
    answer = streamed(b"{}", "gzip")

    with pytest.raises(errors.Transient, match="not valid gzip"):
        canned_client(tmp_path, answer).get_evaluation("ev-1")


# ---------------------------------------------------------------- `evalpush push`


def _bounded_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE_BYTES, CHILD_ADDRESS_SPACE_BYTES))


@pytest.mark.parametrize(
    ("on", "status", "encoding"),
    [
        ("create", 200, "gzip, gzip"),
        ("create", 200, "gzip"),
        ("samples", 422, "gzip, gzip"),
        ("read", 200, "gzip, gzip"),
    ],
    ids=["create-stacked", "create", "samples-error-stacked", "probe-stacked"],
)
def test_push_uploads_the_run_once_past_a_compression_bomb_in_bounded_memory(
    on: str, status: int, encoding: str, platform: LocalPlatform, tmp_path: Path
):
    root = tmp_path / "outputs"
    write_run(root, lines=[trace_line(i, i // 2) for i in range(TRACES)])
    environ = cli_environ(
        platform,
        tmp_path,
        EVALPUSH_UPLOAD__MAX_BATCH_SAMPLES="3",
        EVALPUSH_LOG__LEVEL="warning",
    )
    platform.inject("gzip_bomb", on=on, status=status, encoding=encoding, do_work=on == "create")

    done = subprocess.run(
        [sys.executable, "-m", "evalpush", "push", str(root)],
        env=environ,
        capture_output=True,
        timeout=120,
        preexec_fn=_bounded_address_space,
    )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024

    said = (done.stdout + done.stderr).decode()
    assert "MemoryError" not in said
    assert done.returncode == 0, said
    (evaluation,) = platform.summary()["evaluations"].values()
    assert evaluation["status"] == "COMPLETED" and evaluation["sample_count"] == TRACES
    assert evaluation["duplicates"] == 0
    assert platform.pending_faults() == [], "the bomb was answered"
    assert peak < CHILD_RSS_BOUND_BYTES, f"peak RSS of a child {peak / 2**20:.0f} MiB"
