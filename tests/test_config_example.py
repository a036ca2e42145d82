"""config.example.toml documents every key, and the values it shows are the defaults."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from evalpush.config import Config, section_keys, sections

EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"


def test_the_example_file_loads_and_equals_the_defaults_but_for_an_absolute_root() -> None:
    with EXAMPLE.open("rb") as f:
        example = Config.model_validate(tomllib.load(f))

    (root,) = example.watch.roots
    assert root.is_absolute(), "the daemon refuses a relative root: the example shows one it takes"
    shown, default = example.model_dump(), Config().model_dump()
    shown["watch"]["roots"] = default["watch"]["roots"]
    assert shown == default


def test_every_key_of_every_section_appears_in_the_example() -> None:
    text = EXAMPLE.read_text()
    parts = re.split(r"^\[(\w+)\]\s*$", text, flags=re.MULTILINE)
    documented = {name: body for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    for section, settings in sections().items():
        assert section in documented, f"[{section}] missing"
        for key in section_keys(settings):
            pattern = rf"^#?\s*{key} = "
            assert re.search(pattern, documented[section], re.MULTILINE), f"{section}.{key}"
