"""docs/PLATFORM_API.md states the rule the client applies to evaluation ids: any string the
platform gives, percent-encoded as one path segment, but the empty string, the dot segments,
one over `MAX_ID_CHARS` characters and one holding the key (tests/test_hostile_platform.py
holds the code to it, through the real client)."""

from __future__ import annotations

import re
from pathlib import Path

from evalpush.client import is_platform_id
from evalpush.client.platform import MAX_ID_CHARS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "PLATFORM_API.md"


def ids_paragraph() -> str:
    text = PAGE.read_text()
    start = text.index("Ids are taken as the platform gives them")
    return " ".join(text[start : text.index("\n\n", start)].split())


def test_the_platform_api_page_states_the_evaluation_id_rule_the_client_applies():
    said = ids_paragraph()

    assert f"over {MAX_ID_CHARS:,} characters" in said
    assert "the empty string, `.` and `..`" in said
    assert "percent-encoded segment" in said and "holding part of the API key" in said
    assert "holding a NUL" in said
    assert not re.search(r"\[A-Za-z0-9_-\]|at most 128", PAGE.read_text())


def test_the_ids_the_page_says_are_refused_are_refused_and_its_odd_ones_taken():
    assert not any(is_platform_id(v) for v in ("", ".", "..", "a" * (MAX_ID_CHARS + 1), "e\0"))
    assert all(is_platform_id(v) for v in ("a/b", "a?b#c", "50%", "e 1", "é", "a" * MAX_ID_CHARS))
