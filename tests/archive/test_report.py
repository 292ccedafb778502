"""Verify's report on a real folder: `report.json` and `report.html` say the same thing: the
counts, every difference in a table (escaped), the archive's gaps, and a chart of archived
commands per minute; both written whole."""

from __future__ import annotations

import json
from pathlib import Path

from relay_archive import report, verify


def test_the_html_shows_counts_differences_gaps_and_the_coverage_chart(tmp_path: Path) -> None:
    lost = verify.Difference(
        "message",
        "m<1>",
        verify.MISSING,
        "acknowledged send absent live",
        rebuilt={"queue": "q1", "msg_id": "m<1>", "command": "c7"},
    )
    flipped = verify.Difference(
        "retained", "dev/1/state", verify.MISMATCH, "differs in payload", {"p": "b24"}, {"p": "x"}
    )
    health = verify.ArchiveHealth(gaps={"relay.queue.commands": [(3, 10, 19)]})
    coverage = [(28_000_000, 40), (28_000_001, 10), (28_000_004, 20)]
    counts = verify.counts([lost, flipped])
    doc = report.document(counts, [lost, flipped], health, coverage, {"epoch": "e1"}, 2)
    report.write(tmp_path, doc)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.json"]
    assert json.loads((tmp_path / "report.json").read_text()) == json.loads(json.dumps(doc))
    page = (tmp_path / "report.html").read_text()
    assert "Relay verify: archive has gaps (exit 2)" in page
    for klass, count in counts.items():
        assert f"<tr><td>{klass}</td><td>{count}</td></tr>" in page
    assert "<td>MISSING</td><td>message</td><td>m&lt;1&gt;</td>" in page  # escaped
    assert "<td>acknowledged send absent live</td>" in page
    assert "&quot;command&quot;: &quot;c7&quot;" in page  # the row names the send
    assert "<td>MISMATCH</td><td>retained</td><td>dev/1/state</td>" in page
    assert "m<1>" not in page
    assert "[3, 10, 19]" in page
    # one bar per minute holding records, placed by minute over the span (5 minutes)
    assert page.count("<rect ") == 3
    assert '<rect x="576.0" y="80.0" width="144.0" height="80.0"' in page  # 20 of 40, minute 4
    assert "at most 40 in one minute" in page


def test_no_archived_commands_is_said_not_drawn(tmp_path: Path) -> None:
    doc = report.document(verify.counts([]), [], verify.ArchiveHealth(), [], {}, 0)
    report.write(tmp_path, doc)
    page = (tmp_path / "report.html").read_text()
    assert "Relay verify: clean (exit 0)" in page
    assert "<svg" not in page
    assert "No archived commands." in page
