"""The local platform's viewer pages: the evaluations a person opens from a viewer URL.

`/dashboard/evaluations` lists every evaluation, newest first; `/dashboard/evaluations/{id}`
shows one: name, model, environment, status, metrics, metadata, a histogram of its samples'
rewards, and its samples, a page at a time, each with its completion as a transcript that opens
on click. `/` and `/dashboard` lead to the list. Pages are read and rendered on the storage
thread, so the event loop stays free for the API and control requests meanwhile.

What it promises:
- Server-rendered HTML, no build step and no script: transcripts are `<details>` elements.
- Nothing is fetched from anywhere else: styles and the histogram (SVG) are inline, and the
  `Content-Security-Policy` header lets the browser load nothing but them.
- Every value that came from a client (names, metadata, every part of a sample) is escaped, so a
  sample holding `<script>` shows as that text. The policy would also stop such a script.
- A page holds at most `SAMPLES_PER_PAGE` samples, `MESSAGE_CHARS_SHOWN` characters of a message
  and about `TRANSCRIPT_CHARS_SHOWN` of a transcript, so a 20,000-sample evaluation is a page
  of ordinary size, and so is a page of samples with thousands of messages.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import quote

import msgspec
from aiohttp import web

from evalpush.local_platform._store import Refusal, Store

SAMPLES_PER_PAGE = 100
EVALUATIONS_PER_PAGE = 50
MESSAGE_CHARS_SHOWN = 20_000
TRANSCRIPT_CHARS_SHOWN = 100_000  # a transcript stops after the message that passes this
PREVIEW_CHARS = 140
MAX_PAGE = 1 << 20  # past any real evaluation (100 million samples), within SQLite's integers
HISTOGRAM_BINS = 10
DISTINCT_REWARDS_AS_BARS = 12  # up to this many distinct rewards: one bar each, not ranges
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
STATUS_COLORS = {"RUNNING": "blue", "COMPLETED": "green", "FAILED": "red", "CANCELLED": "grey"}

InDb = Callable[..., Awaitable[Any]]


def add_routes(router: web.UrlDispatcher, store: Store, in_db: InDb) -> None:
    """Serve the viewer pages; `in_db(fn, *args)` runs a storage call on the storage thread."""
    pages = _Pages(store, in_db)
    for path in ("/", "/dashboard", "/dashboard/", "/dashboard/evaluations/"):
        router.add_get(path, pages.home)
    router.add_get("/dashboard/evaluations", pages.evaluations)
    router.add_get("/dashboard/evaluations/{id}", pages.evaluation)


class _Pages:
    def __init__(self, store: Store, in_db: InDb) -> None:
        self._store = store
        self._in_db = in_db

    async def home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/dashboard/evaluations")

    async def evaluations(self, request: web.Request) -> web.StreamResponse:
        try:
            return _html(await self._in_db(self._list, _page_number(request)))
        except Refusal as refusal:
            return _error_page(refusal)

    async def evaluation(self, request: web.Request) -> web.StreamResponse:
        try:
            page = _page_number(request)
            return _html(await self._in_db(self._one, request.match_info["id"], page))
        except Refusal as refusal:
            return _error_page(refusal)

    def _list(self, page: int) -> str:
        skip = (page - 1) * EVALUATIONS_PER_PAGE
        listed = self._store.list_evaluations(None, skip, EVALUATIONS_PER_PAGE, newest_first=True)
        ids = [evaluation["id"] for evaluation in listed["evaluations"]]
        return render_evaluations(listed, self._store.mean_rewards(ids), page)

    def _one(self, evaluation_id: str, page: int) -> str:
        return render_evaluation(
            self._store.get(evaluation_id),
            self._store.rewards(evaluation_id),
            self._store.list_samples(evaluation_id, page, SAMPLES_PER_PAGE),
            page,
        )


def _page_number(request: web.Request) -> int:
    raw = request.query.get("page", "1")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_PAGE):
        raise Refusal(400, f"page must be a whole number from 1 to {MAX_PAGE}, not {raw!r}")
    return int(raw)


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body, status=status, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
    )


def _error_page(refusal: Refusal) -> web.Response:
    content = f'<h1>{refusal.status}</h1><p class="error">{_e(refusal.detail)}</p>'
    return _html(_document(f"{refusal.status}", content), refusal.status)


# -- the reward histogram (pure) --------------------------------------------------------------


class Bar(NamedTuple):
    """One bar of the histogram: rewards from `low` to `high` (equal for a single value)."""

    low: float
    high: float
    count: int


def histogram(rewards: Sequence[float | None]) -> tuple[list[Bar], int]:
    """The bars of a reward histogram, and how many samples have no finite reward.

    A handful of distinct rewards (0 and 1, say) get a bar each; more are put in
    `HISTOGRAM_BINS` equal ranges from the lowest to the highest, the last range closed.
    """
    finite = [r for r in rewards if r is not None and math.isfinite(r)]
    missing = len(rewards) - len(finite)
    counts = Counter(finite)
    if len(counts) <= DISTINCT_REWARDS_AS_BARS:
        return [Bar(value, value, counts[value]) for value in sorted(counts)], missing
    low, high = min(finite), max(finite)
    # Halves: `high - low` overflows to infinity for rewards near the float limits.
    half_span = high / 2 - low / 2
    bins = [0] * HISTOGRAM_BINS
    for reward in finite:
        at = int((reward / 2 - low / 2) / half_span * HISTOGRAM_BINS)
        bins[min(at, HISTOGRAM_BINS - 1)] += 1
    edges = [(low / 2 + half_span * (i / HISTOGRAM_BINS)) * 2 for i in range(HISTOGRAM_BINS)]
    edges.append(high)
    return [Bar(edges[i], edges[i + 1], n) for i, n in enumerate(bins)], missing


# -- rendering ---------------------------------------------------------------------------------


def _e(value: Any) -> str:
    """Any value as escaped text: every client-sent value reaches the page through this."""
    return html.escape(value if isinstance(value, str) else _text(value), quote=True)


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return value
    return _json(value)


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _json(value: Any) -> str:
    try:
        return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    except (TypeError, ValueError):
        return repr(value)


def _when(stamp: Any) -> str:
    try:
        return datetime.fromisoformat(str(stamp)).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return str(stamp)


RUNNING_REFRESH_SECONDS = 5
"""How often the page of an evaluation still RUNNING reloads itself."""


def _status(status: Any) -> str:
    color = STATUS_COLORS.get(str(status), "grey")
    return f'<span class="status {color}">{_e(status)}</span>'


def _uploader_notes(metadata: Any) -> list[tuple[str, str, str]]:
    """What evalpush said of the evaluation in its metadata's `evalpush` key: (badge, color,
    sentence) for a partial upload and for one a newer evaluation superseded."""
    ours = metadata.get("evalpush") if isinstance(metadata, dict) else None
    if not isinstance(ours, dict):
        return []
    notes = []
    if ours.get("complete") is False:
        seen, expected, aside = (
            ours.get("seen_traces"),
            ours.get("expected_traces"),
            ours.get("set_aside"),
        )
        of = f"{seen} of {expected} expected traces" if expected is not None else f"{seen} traces"
        notes.append(("PARTIAL", "amber", f"Partial upload: {of}, {aside} set aside."))
    newer = ours.get("superseded_by")
    if isinstance(newer, str):
        notes.append(
            (
                "SUPERSEDED",
                "grey",
                f"Superseded by evaluation {newer}: the run changed after this upload.",
            )
        )
    return notes


def _badges(metadata: Any) -> str:
    return "".join(
        f' <span class="status {color}" title="{_e(sentence)}">{badge}</span>'
        for badge, color, sentence in _uploader_notes(metadata)
    )


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested objects as (dotted key, leaf) pairs: `{"a": {"b": 1}}` gives ("a.b", 1)."""
    if isinstance(value, dict) and value:
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _pager(page: int, pages: int, link: Callable[[int], str]) -> str:
    if pages <= 1:
        return ""
    parts = []
    for label, target in (("« first", 1), ("‹ previous", page - 1)):
        parts.append(_page_link(label, target, target >= 1 and target != page, link))
    parts.append(f'<span class="here">page {page:,} of {pages:,}</span>')
    for label, target in (("next ›", page + 1), ("last »", pages)):
        parts.append(_page_link(label, target, target <= pages and target != page, link))
    return f'<nav class="pager">{"".join(parts)}</nav>'


def _page_link(label: str, target: int, live: bool, link: Callable[[int], str]) -> str:
    return f'<a href="{link(target)}">{label}</a>' if live else f'<span class="off">{label}</span>'


def render_evaluations(listed: dict[str, Any], means: dict[str, float], page: int) -> str:
    """The list page: one row per evaluation on this page, newest first."""
    total = listed["total"]
    rows = [_evaluation_row(evaluation, means) for evaluation in listed["evaluations"]]
    pages = max(1, -(-total // EVALUATIONS_PER_PAGE))
    if rows:
        table = (
            '<table class="list"><thead><tr><th>Name</th><th>Environment</th><th>Model</th>'
            '<th>Status</th><th class="num">Samples</th><th class="num">Avg reward</th>'
            f"<th>Created (UTC)</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
    elif total:
        table = '<p class="empty">No evaluations on this page. <a href="?page=1">First page</a></p>'
    else:
        table = (
            '<p class="empty">No evaluations yet. Point <code>evalpush push</code> (or the '
            "<code>prime</code> CLI) here with <code>PRIME_API_BASE_URL</code>.</p>"
        )
    pager = _pager(page, pages, lambda n: f"?page={n}")
    content = f'<h1>Evaluations <span class="count">{total:,}</span></h1>{pager}{table}{pager}'
    return _document("Evaluations", content)


def _evaluation_row(evaluation: dict[str, Any], means: dict[str, float]) -> str:
    href = f"/dashboard/evaluations/{quote(str(evaluation['id']), safe='')}"
    return (
        f'<tr><td class="name"><a href="{_e(href)}">{_e(evaluation["name"])}</a></td>'
        f'<td class="plain">{_e(evaluation["environment_name"])}</td>'
        f'<td class="plain">{_e(evaluation.get("model_name"))}</td>'
        f'<td class="plain">{_status(evaluation["status"])}'
        f"{_badges(evaluation.get('metadata'))}</td>"
        f'<td class="num">{evaluation["sample_count"]:,}</td>'
        f'<td class="num">{_e(means.get(evaluation["id"]))}</td>'
        f'<td class="when">{_e(_when(evaluation["created_at"]))}</td></tr>'
    )


def render_evaluation(
    evaluation: dict[str, Any], rewards: list[float | None], samples: dict[str, Any], page: int
) -> str:
    """One evaluation's page, with page `page` of its samples."""
    finite = [r for r in rewards if r is not None and math.isfinite(r)]
    mean = sum(finite) / len(finite) if finite else None
    content = (
        '<nav class="crumbs"><a href="/dashboard/evaluations">Evaluations</a> /</nav>'
        f'<h1 class="title">{_e(evaluation["name"])} {_status(evaluation["status"])}'
        f"{_badges(evaluation.get('metadata'))}</h1>"
        f"{_notes(evaluation.get('metadata'))}"
        f"{_facts(evaluation, mean)}"
        f'<div class="panels">{_metrics(evaluation.get("metrics"))}'
        f"{_histogram_panel(rewards)}</div>"
        f"{_metadata(evaluation.get('metadata'))}"
        f"{_samples(samples, page)}"
    )
    running = str(evaluation["status"]) == "RUNNING"
    if running:  # filled while its run is written: the count grows as the page reloads
        content = (
            f'<p class="note">Running: {evaluation["sample_count"]:,} samples so far; '
            f"this page reloads every {RUNNING_REFRESH_SECONDS} s.</p>{content}"
        )
    return _document(
        str(evaluation["name"]), content, refresh=RUNNING_REFRESH_SECONDS if running else None
    )


def _notes(metadata: Any) -> str:
    return "".join(
        f'<p class="note-box {color}">{_e(sentence)}</p>'
        for _, color, sentence in _uploader_notes(metadata)
    )


def _facts(evaluation: dict[str, Any], mean: float | None) -> str:
    facts = [
        ("Environment", _e(evaluation["environment_name"])),
        ("Model", _e(evaluation.get("model_name"))),
        ("Samples", f"{evaluation['sample_count']:,}"),
        ("Avg reward", _e(mean)),
        ("Created (UTC)", _e(_when(evaluation["created_at"]))),
        ("Updated (UTC)", _e(_when(evaluation["updated_at"]))),
    ]
    cells = "".join(f"<div><dt>{label}</dt><dd>{value}</dd></div>" for label, value in facts)
    cells += f'<div class="wide"><dt>Evaluation id</dt><dd><code>{_e(evaluation["id"])}</code></dd></div>'
    error = evaluation.get("error_message")
    error_box = f'<p class="error">{_e(error)}</p>' if error else ""
    return f'<dl class="facts">{cells}</dl>{error_box}'


def _metrics(metrics: Any) -> str:
    cards = "".join(
        f'<div class="metric"><div class="value">{_e(value)}</div>'
        f'<div class="label">{_e(key)}</div></div>'
        for key, value in _flatten(metrics or {})
        if key
    )
    body = cards or '<p class="empty">No metrics.</p>'
    return f'<section class="panel"><h2>Metrics</h2><div class="metrics">{body}</div></section>'


def _histogram_panel(rewards: list[float | None]) -> str:
    bars, missing = histogram(rewards)
    without = f", {missing:,} without a numeric reward" if missing else ""
    note = f'<p class="note">Samples per reward, all {len(rewards):,} of them{without}.</p>'
    body = _histogram_svg(bars) if bars else '<p class="empty">No rewards.</p>'
    return f'<section class="panel"><h2>Reward distribution</h2>{body}{note}</section>'


def _histogram_svg(bars: list[Bar]) -> str:
    """Bars with their counts above; a value under each bar, or for ranges each edge's value."""
    width, height, top, bottom, side = 480, 200, 22, 24, 18
    slot = (width - 2 * side) / len(bars)
    tallest = max(bar.count for bar in bars) or 1
    ranges = bars[0].low != bars[0].high
    parts = []
    for i, bar in enumerate(bars):
        bar_height = (height - top - bottom) * bar.count / tallest
        x, y = side + i * slot, height - bottom - bar_height
        span = f"{_number(bar.low)} to {_number(bar.high)}" if ranges else _number(bar.low)
        under = "" if ranges else _tick(x + slot / 2, _number(bar.low), height)
        parts.append(
            f"<g><title>reward {_e(span)}: {bar.count:,} samples</title>"
            f'<rect x="{x + slot * 0.1:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}"'
            f' height="{bar_height:.1f}" rx="3"/>'
            f'<text class="count" x="{x + slot / 2:.1f}" y="{y - 6:.1f}">{bar.count:,}</text>'
            f"{under}</g>"
        )
    if ranges:  # short labels at the edges: a range's own ends would not fit under its bar
        edges = [bar.low for bar in bars] + [bars[-1].high]
        parts += [_tick(side + i * slot, f"{edge:.2g}", height) for i, edge in enumerate(edges)]
    return (
        f'<svg class="histogram" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="reward histogram">{"".join(parts)}'
        f'<line x1="0" x2="{width}" y1="{height - bottom}" y2="{height - bottom}"/></svg>'
    )


def _tick(x: float, label: str, height: int) -> str:
    return f'<text x="{x:.1f}" y="{height - 6}">{_e(label)}</text>'


def _metadata(metadata: Any) -> str:
    rows = "".join(
        f"<tr><th>{_e(key)}</th><td>{_e(value)}</td></tr>"
        for key, value in _flatten(metadata or {})
        if key
    )
    if not rows:
        return ""
    return (
        '<section><details class="metadata"><summary><h2>Metadata</h2></summary>'
        f'<table class="kv">{rows}</table></details></section>'
    )


def _samples(samples: dict[str, Any], page: int) -> str:
    total, shown = samples["total"], samples["samples"]
    first = (page - 1) * SAMPLES_PER_PAGE + 1
    pager = _pager(page, max(1, samples["total_pages"]), lambda n: f"?page={n}")
    if shown:
        span = f"{first:,}–{first + len(shown) - 1:,} of {total:,}"
        rows = "".join(_sample_row(first + i, raw, page) for i, raw in enumerate(shown))
        table = (
            '<table class="samples"><thead><tr><th class="num">#</th><th>Sample</th>'
            '<th class="num">Example</th><th class="num">Rollout</th>'
            '<th class="num">Reward</th><th>Completion (click for the transcript)</th></tr>'
            f"</thead><tbody>{rows}</tbody></table>"
        )
    else:
        span = f"none of {total:,} on this page"
        table = '<p class="empty">No samples on this page.</p>' if total else ""
    return (
        f'<section class="sample-list"><h2>Samples <span class="count">{span}</span></h2>'
        f"{pager}{table}{pager}</section>"
    )


def _decoded(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:  # e.g. a number beyond a float's range: show it as it came
        return {"raw": bytes(raw).decode("utf-8", "replace")}


def _sample_row(position: int, raw: msgspec.Raw, page: int) -> str:
    sample = _decoded(raw)
    if not isinstance(sample, dict):
        sample = {"sample": sample}
    completion = sample.get("completion")
    messages = completion if isinstance(completion, list) else []
    anchor = f"sample-{position}"
    return (
        f'<tr><td class="num"><a href="?page={page}#{anchor}">{position:,}</a></td>'
        f'<td class="id"><code title="{_e(sample.get("sample_id"))}">'
        f"{_e(sample.get('sample_id'))}</code></td>"
        f'<td class="num">{_e(sample.get("example_id"))}</td>'
        f'<td class="num">{_e(sample.get("rollout_number"))}</td>'
        f'<td class="num reward">{_e(sample.get("reward"))}</td>'
        f'<td class="completion"><details><summary>{_e(_preview(messages))}</summary>'
        f'<div class="transcript" id="{anchor}">{_transcript(sample, messages, completion)}'
        "</div></details></td></tr>"
    )


def _message_text(message: Any) -> str:
    """A message's content as text: a string as is, text parts joined, anything else as JSON."""
    if not isinstance(message, dict):
        return _json(message)
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else _json(part)
            for part in content
        )
    return "" if content is None else _json(content)


def _preview(messages: list[Any]) -> str:
    """The last assistant message (else the last message) on one line, shortened."""
    if not messages:
        return "(no completion)"
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    last = messages[max((i for i, r in enumerate(roles) if r == "assistant"), default=-1)]
    text = " ".join(_message_text(last).split())
    return text[:PREVIEW_CHARS] + "…" if len(text) > PREVIEW_CHARS else text or "(empty)"


def _shortened(text: str) -> str:
    if len(text) <= MESSAGE_CHARS_SHOWN:
        return _e(text)
    hidden = len(text) - MESSAGE_CHARS_SHOWN
    return (
        f"{_e(text[:MESSAGE_CHARS_SHOWN])}"
        f'<span class="cut">… {hidden:,} more characters not shown</span>'
    )


def _transcript(sample: dict[str, Any], messages: list[Any], completion: Any) -> str:
    parts = [] if messages or completion in (None, []) else [_block("completion", completion)]
    budget = TRANSCRIPT_CHARS_SHOWN
    for shown, message in enumerate(messages):
        if budget <= 0:
            left = len(messages) - shown
            parts.append(f'<p class="cut">… {left:,} more messages not shown</p>')
            break
        html_message, length = _message(message)
        parts.append(html_message)
        budget -= length
    if not messages and not parts:
        parts.append('<p class="empty">No completion messages.</p>')
    for key in ("answer", "error", "stop_condition", "raw"):
        if sample.get(key) not in (None, "", {}):
            parts.append(_block(key, sample[key]))
    return "".join(parts)


def _message(message: Any) -> tuple[str, int]:
    """One message of a transcript, and how many characters of it are shown."""
    role = message.get("role") if isinstance(message, dict) else None
    role_class = role if role in ("system", "user", "assistant", "tool") else "other"
    texts = [("", _message_text(message))]
    if isinstance(message, dict) and message.get("tool_calls"):
        texts.append(("tool calls", _json(message["tool_calls"])))
    body = "".join(
        (f'<div class="role">{label}</div><pre class="calls">' if label else "<pre>")
        + f"{_shortened(text)}</pre>"
        for label, text in texts
        if text or not label
    )
    shown = sum(min(len(text), MESSAGE_CHARS_SHOWN) for _, text in texts)
    return (
        f'<div class="message {role_class}"><div class="role">{_e(role or "message")}</div>'
        f"{body}</div>",
        shown,
    )


def _block(label: str, value: Any) -> str:
    return (
        f'<div class="aside {_e(label)}"><span>{_e(label)}</span>'
        f"<pre>{_shortened(_text(value))}</pre></div>"
    )


def _document(title: str, content: str, *, refresh: int | None = None) -> str:
    """A page; `refresh`: it reloads itself every so many seconds (an evaluation still RUNNING,
    filled while its run is written)."""
    reload = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{reload}'
        f'<link rel="icon" href="data:,"><title>{_e(title)} · evalpush local platform</title>'
        f"<style>{STYLE}</style></head><body>"
        '<header><a href="/dashboard/evaluations">evalpush <span>local platform</span></a>'
        "</header>"
        f"<main>{content}</main></body></html>"
    )


STYLE = """
:root { --ink: #1d2330; --muted: #5f6b7a; --line: #e3e7ee; --bg: #f5f7fa; --card: #fff;
  --accent: #4a5bdc; --green: #1f8a4c; --red: #c2352b; --blue: #2f6fd6; --grey: #6b7280;
  --amber: #b7791f; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background: #1d2330; padding: 12px 28px; }
header a { color: #fff; font-weight: 650; text-decoration: none; letter-spacing: .2px; }
header a span { color: #9aa6ff; font-weight: 400; margin-left: 4px; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 28px 48px; }
a { color: var(--accent); }
h1 { font-size: 22px; margin: 6px 0 16px; overflow-wrap: anywhere; }
h2 { font-size: 15px; margin: 0 0 10px; text-transform: uppercase; letter-spacing: .6px;
  color: var(--muted); }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-size: 13px; }
.count { color: var(--muted); font-weight: 400; font-size: 14px; margin-left: 6px;
  text-transform: none; letter-spacing: 0; }
.crumbs { font-size: 13px; color: var(--muted); }
.status { display: inline-block; font-size: 12px; font-weight: 650; letter-spacing: .5px;
  padding: 2px 9px; border-radius: 999px; vertical-align: middle; color: #fff; }
.status.green { background: var(--green); } .status.red { background: var(--red); }
.status.blue { background: var(--blue); } .status.grey { background: var(--grey); }
.status.amber { background: var(--amber); }
.note-box { border-radius: 10px; padding: 10px 14px; margin: 0 0 12px; border: 1px solid; }
.note-box.amber { background: #fff6e5; border-color: var(--amber); }
.note-box.grey { background: #f1f2f4; border-color: var(--grey); }
.facts { display: flex; flex-wrap: wrap; gap: 1px; background: var(--line);
  border: 1px solid var(--line); border-radius: 10px; overflow: hidden; margin: 0 0 16px; }
.facts div { flex: 1 1 190px; background: var(--card); padding: 10px 14px; }
.facts div.wide { flex-basis: 340px; }
.facts dt { font-size: 12px; color: var(--muted); } .facts dd { margin: 0; font-weight: 600;
  overflow-wrap: anywhere; }
.panels { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; margin-bottom: 16px; }
@media (max-width: 800px) { .panels { grid-template-columns: 1fr; } }
.panel, section > details, .sample-list { background: var(--card); border: 1px solid var(--line);
  border-radius: 10px; padding: 14px 16px; }
section { margin-bottom: 16px; }
.metrics { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px; }
.metric { border: 1px solid var(--line); border-radius: 8px; padding: 8px 10px; }
.metric .value { font-size: 20px; font-weight: 650; overflow-wrap: anywhere; }
.metric .label { font-size: 12px; color: var(--muted); overflow-wrap: anywhere; }
.histogram { width: 100%; height: auto; max-height: 230px; }
.histogram rect { fill: var(--accent); } .histogram g:hover rect { fill: #2e3db8; }
.histogram text { font-size: 12px; fill: var(--muted); text-anchor: middle; }
.histogram text.count { fill: var(--ink); font-weight: 600; }
.histogram line { stroke: var(--line); }
.note, .empty { color: var(--muted); font-size: 13px; margin: 6px 0 0; }
.error { background: #fdecea; color: var(--red); border-radius: 8px; padding: 8px 12px;
  white-space: pre-wrap; }
details.metadata > summary { cursor: pointer; } details.metadata > summary h2 { display: inline; }
table { width: 100%; border-collapse: collapse; }
th { text-align: left; font-size: 12px; color: var(--muted); font-weight: 600;
  border-bottom: 1px solid var(--line); padding: 6px 8px; }
td { border-bottom: 1px solid var(--line); padding: 7px 8px; vertical-align: top; }
.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.list { background: var(--card); border: 1px solid var(--line); border-radius: 10px; }
table.list td.name { overflow-wrap: anywhere; font-weight: 600; }
td.when, td.plain { white-space: nowrap; }
table.kv th { width: 30%; font-family: ui-monospace, monospace; font-weight: 400; }
table.kv td { white-space: pre-wrap; overflow-wrap: anywhere; }
table.samples td.id code { display: inline-block; max-width: 150px; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; vertical-align: bottom; }
td.reward { font-weight: 650; }
td.num a { color: var(--muted); text-decoration: none; } td.num a:hover { color: var(--accent); }
td.completion { width: 60%; }
td.completion summary { cursor: pointer; color: var(--ink); overflow-wrap: anywhere; }
td.completion details[open] summary { color: var(--muted); margin-bottom: 8px; }
.transcript { display: grid; gap: 8px; }
.message { border-radius: 8px; padding: 6px 10px; border-left: 4px solid var(--grey);
  background: #f7f8fa; }
.message.user { border-color: var(--blue); background: #eef4fd; }
.message.assistant { border-color: var(--green); background: #eef8f1; }
.message.system { border-color: #a26bd1; background: #f5effb; }
.message.tool { border-color: #d1902e; background: #fdf5ea; }
.role { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .6px;
  color: var(--muted); }
pre { margin: 2px 0 0; white-space: pre-wrap; overflow-wrap: anywhere; }
pre.calls { color: #7a4b00; }
.aside.error pre { color: var(--red); }
.aside span { font-size: 11px; font-weight: 700; text-transform: uppercase; letter-spacing: .6px;
  color: var(--muted); }
.cut { color: var(--muted); font-style: italic; }
.pager { display: flex; gap: 14px; align-items: center; font-size: 13px; margin: 8px 0; }
.pager .off { color: #b3bac5; } .pager .here { color: var(--muted); }
"""
