"""The one scrubber (`evalpush.log.scrub`): the key raw, escaped and in part, wherever text leaves
the process (log lines, the ledger, the command's output)."""

from __future__ import annotations

import io
import json
import sqlite3
import sys
import urllib.parse
from pathlib import Path

import pytest
import structlog

from evalpush import log
from evalpush.core.setaside import SetAside
from evalpush.core.states import State
from evalpush.ledger import Ledger, default_path
from evalpush.log import REDACTED, register_secret, scrub

KEY = "pk-3fT9qLm2Xv8Rw1Zb7Nc4Hs6Jd0Ky"
ODD_KEY = 'pk-7Hd/2Lq+Xz9="Rm\\4Tc8Wv1Bn5'
"""A key whose JSON, repr and URL spellings each differ from it (printable ASCII allows it)."""


@pytest.fixture(autouse=True)
def registered() -> None:
    register_secret(KEY)
    register_secret(ODD_KEY)


class TestScrub:
    @pytest.mark.parametrize(
        "spelled",
        [
            ODD_KEY,
            json.dumps(ODD_KEY)[1:-1],
            repr(ODD_KEY.encode())[2:-1],
            urllib.parse.quote(ODD_KEY, safe=""),
            f"Bearer {KEY}",
        ],
        ids=["raw", "json", "repr of bytes", "percent-encoded", "bearer"],
    )
    def test_the_key_is_replaced_however_it_is_spelled(self, spelled: str) -> None:
        assert spelled == ODD_KEY or ODD_KEY not in spelled  # each form differs from the key
        scrubbed = scrub(f"the server said: {spelled}.")
        assert spelled[:8] not in scrubbed and spelled[-8:] not in scrubbed
        assert scrubbed.startswith("the server said: ") and scrubbed.endswith(".")
        assert REDACTED in scrubbed

    @pytest.mark.parametrize(
        "part", [KEY[:8], KEY[-8:], KEY[5:19], KEY[:-1]], ids=["head", "tail", "middle", "cut"]
    )
    def test_any_run_of_eight_characters_of_the_key_is_replaced(self, part: str) -> None:
        assert scrub(f"body: {{'detail': '{part}'}}") == f"body: {{'detail': '{REDACTED}'}}"

    def test_a_run_shorter_than_eight_is_left_as_ordinary_text(self) -> None:
        assert scrub(f"id {KEY[:7]}") == f"id {KEY[:7]}"

    def test_ordinary_text_is_untouched(self) -> None:
        # (No long digit run: other tests register keys like "sk-test-secret-0123456789abcdef",
        # and the registry is the process's.)
        text = "push samples to e1: HTTP 503: injected fault (trace-12, line 7, evalpush)"
        assert scrub(text) == text

    def test_a_key_broken_by_an_escaped_newline_is_replaced_on_both_sides(self) -> None:
        key = "sk-Wq7Zp3Lm9\nXr5Tb2Nv8Kc"
        register_secret(key)
        for rendered in (repr(key), json.dumps(key), repr(key.encode()), key):
            scrubbed = scrub(f"Illegal header value b'Bearer {rendered}'")
            assert "Wq7Zp3Lm" not in scrubbed and "Xr5Tb2Nv" not in scrubbed, scrubbed

    def test_the_key_glued_to_other_text_is_cut_out_without_it(self) -> None:
        assert scrub(f"abc{KEY}xyz") == f"abc{REDACTED}xyz"


class TestWhereTextLeaves:
    def test_a_log_line_never_carries_a_part_of_the_key(self) -> None:
        saved = structlog.get_config()
        out = io.StringIO()
        try:
            log.configure(level="debug", fmt="json", stream=out)
            logger = log.get_logger(run="r1")
            logger.warning("echoed", body=f'{{"detail": "{KEY[:20]}\\n{KEY[20:]}"}}')
            logger.warning("bytes", raw=KEY.encode())
            logger.warning("nested", reasons=[{"why": KEY[3:]}])
        finally:
            structlog.configure(**saved)
        rendered = out.getvalue()
        for i in range(len(KEY) - 7):
            assert KEY[i : i + 8] not in rendered
        assert rendered.count(REDACTED) >= 3

    def test_a_set_aside_reason_quoting_the_key_is_stored_scrubbed(self, tmp_path: Path) -> None:
        with Ledger(default_path(tmp_path)) as ledger:
            record = ledger.add(path="/runs/r1", run_id="r1", kind="eval", state=State.READY)
            reason = f'push samples: HTTP 422: {{"detail": "you sent Bearer {KEY}"}}'
            ledger.add_set_aside(record, [SetAside(1, 0, 10, "rejected", reason)])
            (stored,) = ledger.set_aside(record)
        assert KEY[:8] not in stored.reason and REDACTED in stored.reason
        for path in tmp_path.iterdir():
            assert KEY[:8].encode() not in path.read_bytes(), path
        with sqlite3.connect(default_path(tmp_path)) as db:
            assert db.execute("SELECT COUNT(*) FROM set_aside").fetchone() == (1,)

    def test_texts_stored_before_the_key_was_known_are_scrubbed_leaving_no_copy_in_the_file(
        self, tmp_path: Path
    ) -> None:
        """As an older evalpush left them: one set-aside reason per refused sample, an error."""
        late_key = "pk-9Wq2Lr5Tz8Xc1Vb4Nm7Hs3Jd6Kf0"  # registered only after the writes
        echoed = f"HTTP 422: echo {late_key} and more text to make it long " * 3
        with Ledger(default_path(tmp_path)) as ledger:
            record = ledger.add(path="/runs/r1", run_id="r1", kind="eval", state=State.READY)
            ledger.add_set_aside(record, [SetAside(i, i, 1, "rejected", echoed) for i in range(50)])
            ledger.update(record, last_error=f"boom {late_key}")
        register_secret(late_key)

        with Ledger(default_path(tmp_path)) as ledger:
            assert ledger.scrub_secrets() == 2
            assert ledger.scrub_secrets() == 0, "nothing left to scrub"
            assert len(ledger.set_aside(record)) == 50
            assert ledger.get(record.id).last_error == f"boom {REDACTED}"

        parts = {late_key[i : i + 8].encode() for i in range(len(late_key) - 7)}
        for path in tmp_path.iterdir():
            data = path.read_bytes()
            assert not [part for part in parts if part in data], path

    def test_what_the_command_prints_is_scrubbed_and_the_streams_restored(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        before = sys.stdout, sys.stderr

        @log.scrubbed_output
        def command() -> int:
            print(f"api key: {KEY}")
            print(f"error: {KEY[4:20]}", file=sys.stderr)
            return 7

        assert command() == 7
        assert (sys.stdout, sys.stderr) == before
        captured = capsys.readouterr()
        assert captured.out == f"api key: {REDACTED}\n"
        assert captured.err == f"error: {REDACTED}\n"
