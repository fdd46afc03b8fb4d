"""The shell every report page shares: styles, one small script, a strict content policy.

Pages are self-contained (no CDN, no external file) and every string that came from a
model, a tool or a task goes through `esc`. As a second wall, the Content-Security-Policy
allows only this module's own script (by its hash): text that slipped through unescaped
still could not run.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape
from typing import Any

CSS = """
:root { --fg:#1d232a; --muted:#5b6670; --line:#d8dee4; --bg:#ffffff; --panel:#f6f8fa;
  --prompt:#eef1f4; --policy:#d7f5dd; --environment:#dbeafe; --echo:#fff1c2;
  --template:#f3e1f7; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0 auto; padding: 20px 28px 60px; max-width: 1180px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px;
  border-bottom: 1px solid var(--line); padding-bottom: 4px; } h3 { font-size: 15px; }
.sub { color: var(--muted); margin: 0 0 14px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(200px, 1fr)); gap: 10px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
  padding: 10px 12px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase;
  letter-spacing: .03em; } .card .value { font-size: 22px; font-weight: 600; }
.card .detail { color: var(--muted); font-size: 12px; }
.grid2 { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 14px; }
figure.curve { margin: 0; background: var(--bg); border: 1px solid var(--line);
  border-radius: 6px; padding: 10px; }
figcaption { font-weight: 600; margin-bottom: 4px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 10px; margin-bottom: 4px; }
.legend-item { font: inherit; font-size: 12px; background: none; border: 0; padding: 0;
  cursor: pointer; color: var(--fg); } .legend-item[aria-pressed="false"] { opacity: .35; }
.swatch { display: inline-block; width: 14px; height: 3px; margin: 0 4px 3px 0;
  vertical-align: middle; }
svg.chart { max-width: 100%; height: auto; display: block; }
svg .plot-bg { fill: #fbfcfd; stroke: var(--line); } svg .grid { stroke: #e7ebef; }
svg .tick { font-size: 11px; fill: var(--muted); } svg .unit { font-size: 11px;
  fill: var(--muted); font-style: italic; } svg .empty { font-size: 12px; fill: var(--muted); }
svg g.hidden { display: none; }
.note { color: var(--muted); font-size: 12px; margin: 4px 0 0; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left;
  vertical-align: top; } th { color: var(--muted); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: inline-block; height: 9px; background: #8aa4bf; vertical-align: middle; }
.tag { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px;
  background: var(--panel); border: 1px solid var(--line); }
.tag.ok { background: #dcf5e3; } .tag.bad { background: #fde2e1; }
.tag.env { background: #dbeafe; } .tag.eval { background: #f3e1f7; }
pre { background: var(--panel); padding: 8px; overflow-x: auto; font-size: 12px;
  white-space: pre-wrap; word-break: break-word; }
.seg { white-space: pre-wrap; word-break: break-word; font: 13px/1.5 ui-monospace,
  SFMono-Regular, Menlo, monospace; border-radius: 3px; }
.src-prompt { background: var(--prompt); color: #4a5560; } .src-policy { background: var(--policy);
  box-shadow: inset 0 -2px #22a045; } .src-environment { background: var(--environment); }
.src-echo { background: var(--echo); text-decoration: line-through; }
.src-template { background: var(--template); color: #7b3a8a; }
.tokens { border: 1px solid var(--line); border-radius: 6px; padding: 10px; }
.strip { display: flex; flex-wrap: wrap; gap: 1px; margin: 6px 0 10px; }
.strip i { display: block; width: 6px; height: 14px; }
.strip i.loss { outline: 1px solid #22a045; height: 18px; }
a { color: #0b5cad; }
body.mask-only .seg:not(.src-policy) { opacity: .25; }
"""

SCRIPT = """
document.querySelectorAll('.legend-item').forEach(function (b) {
  b.addEventListener('click', function () {
    var on = b.getAttribute('aria-pressed') !== 'false';
    b.setAttribute('aria-pressed', on ? 'false' : 'true');
    var fig = b.closest('figure');
    fig.querySelectorAll('g.series').forEach(function (g) {
      if (g.getAttribute('data-series') === b.getAttribute('data-series')) {
        g.classList.toggle('hidden', on);
      }
    });
  });
});
var mask = document.getElementById('mask-only');
if (mask) { mask.addEventListener('change', function () {
  document.body.classList.toggle('mask-only', mask.checked); }); }
document.documentElement.setAttribute('data-ready', '1');
"""

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    f"script-src 'sha256-{_SCRIPT_HASH}'"
)


def esc(value: Any) -> str:
    """Any value as HTML text: every ``<``, ``&`` and quote escaped."""
    return escape("" if value is None else str(value), quote=True)


def page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}"
        f"<script>{SCRIPT}</script></body></html>\n"
    )


def table(headers: list[str], rows: list[list[Any]], num: set[int] | None = None) -> str:
    """A table; cells are escaped unless they are `Raw`."""
    num = num or set()
    head = "".join(
        f"<th{' class=num' if i in num else ''}>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=num' if i in num else ''}>{c if isinstance(c, Raw) else esc(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Raw(str):
    """HTML this module built itself (already escaped where it holds data)."""


def num(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def bar(v: float, width: int = 120) -> Raw:
    return Raw(f'<span class="bar" style="width:{max(0.0, min(1.0, v)) * width:.0f}px"></span>')
