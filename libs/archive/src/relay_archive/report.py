"""Verify's report: `report.json` (for machines) and `report.html` (for people: counts, a table
of differences, a chart of archive coverage over time), written side by side.

Invariant: both files say the same thing (the HTML is rendered from the JSON document), every
value in the HTML is escaped, and the files are written to temporary names and renamed, so a
reader never sees half a report.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from relay_archive.verify import ArchiveHealth, Difference

SHOWN = 500
"""Differences listed in the HTML table (all of them are in the JSON)."""


def document(
    counts: dict[str, int],
    differences: list[Difference],
    health: ArchiveHealth,
    coverage: list[tuple[int, int]],
    cut: dict[str, Any],
    code: int,
) -> dict[str, Any]:
    return {
        "exit": code,
        "verdict": {0: "clean", 1: "differences", 2: "archive has gaps"}[code],
        "counts": counts,
        "cut": cut,
        "archive": {"gaps": health.gaps, "corrupt": health.corrupt},
        "coverage_per_minute": [[minute, records] for minute, records in coverage],
        "differences": [asdict(d) for d in differences],
    }


def _chart(coverage: list[list[int]]) -> str:
    """An SVG bar chart of archived commands per minute (gaps show as empty minutes)."""
    if not coverage:
        return "<p>No archived commands.</p>"
    width, height = 720, 160
    first, last = coverage[0][0], coverage[-1][0]
    span = max(1, last - first + 1)
    top = max(records for _, records in coverage)
    bar = max(1.0, width / span)
    bars = "".join(
        f'<rect x="{(minute - first) * width / span:.1f}" '
        f'y="{height - records * height / top:.1f}" '
        f'width="{bar:.1f}" height="{records * height / top:.1f}" fill="#4a7"/>'
        for minute, records in coverage
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}">'
        f'{bars}<text x="0" y="{height + 15}" font-size="11">minute {first}</text>'
        f'<text x="{width - 90}" y="{height + 15}" font-size="11">minute {last}</text></svg>'
        f"<p>Archived commands per minute (Unix minutes), at most {top} in one minute.</p>"
    )


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    counts = "".join(f"<tr><td>{e(k)}</td><td>{v}</td></tr>" for k, v in doc["counts"].items())
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{e(str(d[k]))}</td>" for k in ("klass", "what", "key", "reason"))
        + f"<td><code>{e(json.dumps(d['rebuilt'] or d['live'], sort_keys=True)[:300])}</code></td>"
        "</tr>"
        for d in doc["differences"][:SHOWN]
    )
    gaps = e(json.dumps(doc["archive"], sort_keys=True))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Relay verify: {e(doc["verdict"])}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:2px 6px}}
table{{border-collapse:collapse}}</style></head><body>
<h1>Relay verify: {e(doc["verdict"])} (exit {doc["exit"]})</h1>
<p>Cut: <code>{e(json.dumps(doc["cut"], sort_keys=True))}</code></p>
<h2>Counts</h2><table><tr><th>class</th><th>differences</th></tr>{counts}</table>
<h2>Archive</h2><p>Gaps and damaged files: <code>{gaps}</code></p>
{_chart(doc["coverage_per_minute"])}
<h2>Differences (first {SHOWN})</h2>
<table><tr><th>class</th><th>what</th><th>key</th><th>reason</th><th>row</th></tr>{rows}</table>
</body></html>
"""


def write(folder: Path, doc: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("report.json", json.dumps(doc, indent=1, sort_keys=True)),
        ("report.html", render_html(doc)),
    ):
        temporary = folder / f".{name}.tmp"
        temporary.write_text(text)
        os.replace(temporary, folder / name)
