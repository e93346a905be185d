"""The dashboard's page frame and the cells every page shares.

A page is a ``PageView``: the HTML of its live region and the facts behind it as JSON.
``document`` wraps a view in the frame (navigation, styles, one inline script):
``/<page>`` serves the document; ``/api/<page>`` serves the view as JSON, and the script
replaces the live region ``#live`` with its ``html`` every ``REFRESH_S`` seconds, so the
first paint and every refresh come from the same renderer.

Self-contained by construction: no CDN, no font, no image, no link to another origin. The
one script is inline and allowed by its SHA-256 in the Content-Security-Policy (``CSP``),
which also forbids every other origin, so the browser itself refuses a stray external
request.

Stable hooks for tests and scripts: ``body[data-page]``, ``body[data-updated-at]`` (the
time of the data shown), ``body[data-refreshes]`` (live-region replacements so far), and
``[data-error]`` banners (a service that did not answer: the page renders what it has).
The pages add their own (``allot.services.dashboard.pages``, ``allot.services.dashboard.workload``).
"""

from __future__ import annotations

import base64
import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote

from allot.core.duration_text import format_duration

REFRESH_S = 2.0

PAGES = (
    ("fairshare", "/", "Fair share"),
    ("queue", "/queue", "Queue"),
    ("hosts", "/hosts", "Hosts"),
    ("owed", "/owed", "Owed vs delivered"),
)
"""(page id, path, title) in navigation order; ``workload`` pages are reached by links."""


_SCRIPT = """
(function () {
  var body = document.body, api = body.getAttribute("data-api");
  var live = document.getElementById("live"), state = document.getElementById("refresh");
  if (!api || !live) { return; }
  function tick() {
    if (document.hidden) { setTimeout(tick, REFRESH_MS); return; }
    fetch(api, {cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (doc) {
        live.innerHTML = doc.html;
        body.setAttribute("data-updated-at", String(doc.at));
        var n = Number(body.getAttribute("data-refreshes") || "0") + 1;
        body.setAttribute("data-refreshes", String(n));
        state.textContent = "live, updated " + new Date(doc.at * 1000).toLocaleTimeString();
        state.className = "ok";
      })
      .catch(function (e) {
        state.textContent = "not updating: " + e.message + " (retrying)";
        state.className = "stale";
      })
      .then(function () { setTimeout(tick, REFRESH_MS); });
  }
  setTimeout(tick, REFRESH_MS);
})();
""".replace("REFRESH_MS", str(int(REFRESH_S * 1000)))

CSP = (
    "default-src 'none'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Content-Security-Policy of every page: the inline script by hash, fetches to this origin
only, nothing else from anywhere."""

_CSS = """
body { font-family: sans-serif; margin: 0; color: #222; }
header { background: #2d3e50; color: #fff; padding: 8px 24px; display: flex; gap: 18px;
         align-items: baseline; flex-wrap: wrap; }
header a { color: #dfe8f1; text-decoration: none; }
header a[aria-current] { color: #fff; font-weight: bold; border-bottom: 2px solid #f28e2b; }
header .brand { font-weight: bold; color: #fff; margin-right: 12px; }
#refresh { margin-left: auto; font-size: 12px; }
#refresh.stale { color: #ffb4a8; }
main { padding: 8px 24px 32px; max-width: 1400px; }
h1 { font-size: 21px; } h2 { font-size: 16px; margin-top: 24px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; vertical-align: top; }
th.l, td.l { text-align: left; }
thead th { background: #f3f3f3; }
.note { color: #555; font-size: 13px; max-width: 960px; }
.error { background: #fde8e6; border: 1px solid #e15759; padding: 6px 10px; margin: 8px 0; }
.over { color: #b00; } .under { color: #2a7a2a; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; }
.est { font-style: italic; color: #555; }
code { background: #f3f3f3; padding: 0 3px; }
ol.timeline { list-style: none; padding-left: 0; }
ol.timeline li { border-left: 3px solid #4e79a7; padding: 4px 10px; margin: 0 0 6px; }
ol.timeline li[data-event-kind="notice"], ol.timeline li[data-event-kind="preempted"] {
  border-left-color: #e15759; background: #fdf1f0; }
ol.timeline li[data-event-kind="requeued"] { border-left-color: #f28e2b; }
ol.timeline .when { color: #555; font-size: 12px; margin-right: 8px; }
"""


@dataclass(frozen=True, slots=True)
class PageView:
    """One page's live region (``html``) and the facts behind it (``data``, JSON types)."""

    page: str
    title: str
    html: str
    data: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    status: int = 200


def document(view: PageView, api_path: str) -> str:
    """The whole HTML document of ``view``; the script polls ``api_path``."""
    nav = " ".join(
        f'<a href="{path}" data-nav="{page}"'
        + (' aria-current="page"' if page == view.page else "")
        + f">{escape(title)}</a>"
        for page, path, title in PAGES
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Allot · {escape(view.title)}</title>\n<style>{_CSS}</style>\n</head>\n"
        f'<body data-page="{escape(view.page)}" data-api="{escape(api_path)}" '
        f'data-updated-at="{view.at:.3f}" data-refreshes="0">\n'
        f'<header><span class="brand">Allot</span> {nav} '
        f'<span id="refresh">live every {REFRESH_S:g} s</span></header>\n'
        f"<main>\n<h1>{escape(view.title)}</h1>\n"
        f'<div id="live">\n{view.html}\n</div>\n</main>\n'
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n"
    )


def error_banners(errors: Sequence[str]) -> str:
    return "\n".join(
        f'<div class="error" data-error>{escape(e)}</div>' for e in dict.fromkeys(errors)
    )


# ------------------------------------------------------------------------------ cells


def table(heads: Sequence[tuple[str, str]], rows: Sequence[str], *, table_id: str) -> str:
    """``heads``: (text, css class); ``rows``: whole ``<tr>`` elements, already escaped."""
    head = "".join(
        f'<th class="{cls}">{escape(text)}</th>' if cls else f"<th>{escape(text)}</th>"
        for text, cls in heads
    )
    return (
        f'<table id="{table_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n'
        + "\n".join(rows)
        + "\n</tbody>\n</table>"
    )


def workload_link(workload_id: str) -> str:
    return f'<a href="/workload/{quote(workload_id, safe="")}">{escape(workload_id)}</a>'


def clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def when(t: float, now: float) -> str:
    """Absolute UTC time and how far from ``now`` it is."""
    delta = t - now
    rel = (
        "now"
        if abs(delta) < 1
        else (f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago")
    )
    return f'<time data-t="{t:.3f}" title="{clock(t)}">{clock(t)[11:19]} ({rel})</time>'


def num(value: float | None, decimals: int) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "" if value is None else str(value)
    return f"{value:,.{decimals}f}"


def pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def reason_cell(code: str, why: str, numbers: Mapping[str, object]) -> str:
    title = ", ".join(f"{k}={v}" for k, v in sorted(numbers.items()))
    head = f'<code title="{escape(title)}">{escape(code)}</code> ' if code else ""
    return head + escape(why)


def estimate(est: float | None, at: float) -> str:
    if est is None:
        return "unknown (nothing bounds it)"
    if est <= at:
        return "~now (estimate)"
    return f"~in {format_duration(est - at)} (estimate), {clock(est)}"
