"""Look at a page as a person would: Debian's chromium, headless, and a small HTML reader.

`Chromium` runs the browser as plain subprocesses (`--dump-dom`, `--screenshot`), no WebDriver:
the viewer pages have no script to wait for, so the DOM chromium serializes once a page has
loaded is the page a person sees (with `<details>` opened by a `#fragment`, as a click would).
`Page` reads HTML (the server's or chromium's) into what a test asserts on: text, elements,
attributes.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

RUN_SECONDS = 60.0
# Root needs --no-sandbox; the rest keep chromium from reaching anything but the page.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
INSTALL_HINT = "apt-get install -y chromium (.ci/run installs it when missing)"


class Chromium:
    """Headless chromium with a fresh profile under `profiles`."""

    def __init__(self, executable: str, profiles: Path) -> None:
        self._executable = executable
        self._profiles = profiles
        self._runs = 0

    def dump_dom(self, url: str) -> str:
        """The DOM of `url` once loaded, serialized as HTML."""
        return self._run("--dump-dom", url).stdout

    def screenshot(self, url: str, out: Path, *, width: int = 1280, height: int = 1500) -> None:
        """A PNG of the `width` x `height` window showing `url`, written to `out`."""
        out.parent.mkdir(parents=True, exist_ok=True)
        self._run(f"--window-size={width},{height}", f"--screenshot={out}", url)
        if not out.is_file() or out.stat().st_size == 0:
            raise RuntimeError(f"chromium wrote no screenshot to {out}")

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        self._runs += 1
        profile = self._profiles / f"profile-{self._runs}"
        command = [self._executable, *FLAGS, f"--user-data-dir={profile}", *args]
        # Its own session: on a timeout the browser and every helper process it forked go.
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=RUN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise RuntimeError(f"chromium did not finish in {RUN_SECONDS:.0f} s: {args}") from None
        if process.returncode != 0:
            raise RuntimeError(f"chromium exited {process.returncode}: {stderr[-2000:]}")
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@functools.cache
def why_chromium_cannot_run() -> str | None:
    """None when chromium is installed and loads a page here; else why not, for a skip."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        return f"chromium is not installed: {INSTALL_HINT}"
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"evalpush-chromium-probe-{os.getpid()}"
    try:
        dom = Chromium(executable, scratch).dump_dom("data:text/html,<p>probe</p>")
    except (OSError, RuntimeError) as exc:
        return f"chromium cannot run here ({executable}): {exc}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None if "probe" in dom else f"chromium ({executable}) loaded nothing: {dom[:200]!r}"


def chromium(profiles: Path) -> Chromium:
    """The installed chromium, with profiles under `profiles`; check `why_chromium_cannot_run`."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable is not None, INSTALL_HINT
    return Chromium(executable, profiles)


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    ancestors: tuple[
        tuple[str, str], ...
    ]  # (tag, class) of each enclosing element, outermost first
    text: list[str] = field(default_factory=list)

    def within(self, tag: str, cls: str | None = None) -> bool:
        return any(t == tag and (cls is None or cls in c.split()) for t, c in self.ancestors)

    @property
    def classes(self) -> list[str]:
        return self.attrs.get("class", "").split()

    @property
    def content(self) -> str:
        """The element's text, its descendants' included, whitespace collapsed."""
        return " ".join(" ".join(self.text).split())


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class Page(HTMLParser):
    """A page's elements (with their text and ancestors) and its visible text."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self._text: list[str] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ancestors = tuple((e.tag, e.attrs.get("class", "")) for e in self._open)
        element = Element(tag, {k: v or "" for k, v in attrs}, ancestors)
        self.elements.append(element)
        if tag not in VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        if any(e.tag in ("style", "script", "title") for e in self._open):
            if self._open and self._open[-1].tag == "title":
                self._open[-1].text.append(data)
            return
        self._text.append(data)
        for element in self._open:
            element.text.append(data)

    @property
    def text(self) -> str:
        """Everything a person can read on the page, whitespace collapsed."""
        return " ".join(" ".join(self._text).split())

    @property
    def title(self) -> str:
        return " ".join(e.content for e in self.find("title"))

    def find(self, tag: str, cls: str | None = None) -> list[Element]:
        return [e for e in self.elements if e.tag == tag and (cls is None or cls in e.classes)]

    def sample_rows(self) -> list[Element]:
        return [e for e in self.find("tr") if e.within("table", "samples") and e.within("tbody")]
