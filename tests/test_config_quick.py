"""`config_quick` takes only what pydantic takes, as the same value with the same keys given.

Each case is validated twice: by `config_quick.plainly_valid` (no pydantic) and by the generated
pydantic models (`config_models.validate_data`). Where the quick path answers, pydantic must
accept the same input and build an equal value: every key's value of the same type, and the
same keys given in every section. Where pydantic refuses, the quick path must have declined.
"""

from __future__ import annotations

import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from evalpush.config import (
    Config,
    LogConfig,
    UploadConfig,
    WatchConfig,
    _Settings,
    section_keys,
    sections,
)
from evalpush.config_models import validate_data
from evalpush.config_quick import plainly_valid

EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"

VALUES: list[Any] = [
    *(0, 1, -1, 4, 64, 65, 1023, 1024, 26214400, 26214401, 2**53, 2**53 + 1, 2**70),
    *(0.0, -0.0, 0.5, 4.0, 1e308, math.inf, -math.inf, math.nan, True, False, None),
    *("", "0", "1", "4", "04", "+4", "-4", " 4", "4 ", "1_0", "1.5", "1.", ".5", "1e3"),
    *("inf", "nan", "0x10", "\u0661", "\uff14", "99999999999999999999", "0.0000001"),
    *("true", "TRUE", "True", "false", "yes", "No", "on", "OFF", "t", "f", "y", "n", "2"),
    *("auto", "AUTO", "inotify", "polling", "json", "console", "debug", "DEBUG", "Info"),
    *("skip", "hold", "HOLD", "127.0.0.1:9464", "[::1]:9464", "[::1]:0", "localhost:1"),
    *("no-port", "host:99999", "[nope]:1", "/data", "relative", "~/x", "a\0b", "\u00e9"),
    *("\udcff", " /spaced ", "https://platform.example", Path("/p"), Path("")),
    *([], ["/a"], ["/a", "b"], [""], [1], [None], ["a\0b"], [Path("/p")], ("a",), {"a"}),
    *({}, {"a": 1}, b"bytes", bytearray(b"x"), 3 + 0j),
]


def shape(value: Any) -> Any:
    """A value as nested tuples naming each part's type, and each section's keys given."""
    if isinstance(value, _Settings):  # a section, or Config
        fields = type(value).__dataclass_fields__
        return (
            type(value).__name__,
            sorted(value.model_fields_set),
            tuple((name, shape(getattr(value, name))) for name in fields),
        )
    if isinstance(value, list):
        return ("list", tuple(shape(item) for item in value))
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


def judged_alike(data: Any) -> bool:
    """Check one input on both paths; whether the quick path answered."""
    quick = plainly_valid(Config, data)
    try:
        validated = validate_data(Config, data)
    except ValidationError:
        assert quick is None, f"quick path took {data!r}, which pydantic refuses"
        return False
    if quick is not None:
        assert shape(quick) == shape(validated), data
    return quick is not None


def every_key() -> list[tuple[str, str]]:
    return [(name, key) for name, section in sections().items() for key in section_keys(section)]


def test_every_key_with_every_value_is_taken_as_pydantic_takes_it() -> None:
    keys = every_key()
    taken = sum(judged_alike({section: {key: value}}) for section, key in keys for value in VALUES)

    assert taken >= 500  # the common forms do take the quick path (580 of 2,550 cases)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"watch": {}},
        {"watch": None},
        {"watch": "scalar"},
        {"watch": []},
        {"nope": {}},
        {"watch": {"nope": 1}},
        {"watch": {"roots": ["/a"], "nope": 1}},
        {"watch": WatchConfig(rescan_seconds=5)},
        {"watch": LogConfig()},
        {"log": {"level": "DEBUG", "format": "json"}, "upload": {"max_batch_samples": "7"}},
        {"upload": {"max_concurrent_runs": 0}},
        {"upload": {"max_concurrent_runs": "64", "max_batch_bytes": "1024"}},
        {"upload": UploadConfig(), "watch": {"roots": []}},
        {"metrics": {"listen": ""}},
        {"state": {"dir": None}},
        {"platform": {"api_base_url": None, "api_key_file": "/run/key", "team_id": "t"}},
    ],
)
def test_whole_configurations_are_taken_as_pydantic_takes_them(data: dict[str, Any]) -> None:
    judged_alike(data)


def test_the_example_file_and_plain_settings_take_the_quick_path() -> None:
    example = tomllib.loads(EXAMPLE.read_text())
    plain = {
        "watch": {"roots": ["/data/evals", "relative"], "rescan_seconds": 60, "observer": "auto"},
        "runs": {"settle_seconds": "300", "upload_replays": "true", "marker": "DONE"},
        "upload": {"max_concurrent_runs": "8", "max_batch_samples": 500},
        "platform": {"allow_insecure_http": True, "read_timeout_seconds": "2.5"},
        "log": {"level": "DEBUG", "format": "json"},
        "metrics": {"listen": "127.0.0.1:9464"},
        "state": {"dir": "/var/lib/evalpush"},
    }

    assert judged_alike(example)
    assert judged_alike(plain)


def test_keyword_arguments_that_are_plainly_valid_import_no_pydantic() -> None:
    code = (
        "import sys\n"
        "from evalpush.config import Config, load_config\n"
        "c = Config(upload={'max_batch_samples': 7}, log={'level': 'DEBUG'})\n"
        "e = load_config(environ={'EVALPUSH_WATCH__ROOTS': '[\"/a\"]',"
        " 'EVALPUSH_RUNS__SETTLE_SECONDS': '5'})\n"
        "assert c.upload.max_batch_samples == 7 and c.log.level == 'debug'\n"
        "assert e.watch.roots == [__import__('pathlib').Path('/a')]\n"
        "assert e.runs.settle_seconds == 5.0 and e.runs.model_fields_set == {'settle_seconds'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
