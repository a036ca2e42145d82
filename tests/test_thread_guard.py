"""The thread-leak guards of conftest.py, run on tests that leak: a pytest session in a
subprocess with this conftest, whose tests leave daemon threads (as watchdog's are) running."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LEAKY_TESTS = """
import threading

import pytest

STOP = threading.Event()


def start(name):
    threading.Thread(target=STOP.wait, args=(60,), name=name, daemon=True).start()


@pytest.fixture(scope="module")
def shared_thread():
    start("left-by-a-module-fixture")
    yield


def test_leaves_a_daemon_thread_running():
    start("left-by-a-test")


def test_stops_the_thread_it_started():
    thread = threading.Thread(target=STOP.wait, args=(0.1,), name="stopped", daemon=True)
    thread.start()
    thread.join()


def test_uses_a_module_fixture_that_leaves_its_thread_running(shared_thread):
    pass
"""


@pytest.fixture
def leaky_session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_leaky=LEAKY_TESTS)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the conftest imports `support`
    monkeypatch.setenv("EVALPUSH_TEST_THREAD_GRACE_SECONDS", "0.5")  # these threads never end
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_daemon_thread_left_running_fails_the_test_or_module_that_left_it_by_name(
    leaky_session,
):
    leaky_session.assert_outcomes(passed=3, errors=2)
    leaky_session.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaves_a_daemon_thread_running*",
            "*threads outlived the test: left-by-a-test (daemon threading.Thread)",
        ]
    )
    leaky_session.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_uses_a_module_fixture_that_leaves_its_thread_running*",
            "*threads outlived the module: left-by-a-module-fixture (daemon threading.Thread)",
        ]
    )
    output = leaky_session.stdout.str()
    assert "ERROR test_leaky.py::test_stops_the_thread_it_started" not in output
    assert "stopped (" not in output, "a thread joined in time is no leak"
