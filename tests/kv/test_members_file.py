"""`members.json`, the replicator's membership on disk (`relay_replicator.peers`): a file of the
static membership (v1) reads as view 1 of its sites; the view, the URLs and a change under way
(participants, this site's report, the shards it pulled) survive a save and a load, so a
restarted replicator resumes the change where it was."""

from __future__ import annotations

import json
from pathlib import Path

from relay_kv import membership
from relay_kv.membership import Report
from relay_kv.placement import View
from relay_replicator.peers import Peers
from relay_runtime.readiness import Readiness

A, B, C = "A" * 16, "B" * 16, "C" * 16


def peers(path: Path, me: str = A, urls: tuple[str, ...] = ()) -> Peers:
    return Peers(
        me,
        list(urls),
        token=None,
        timeout_s=1,
        down_s=1,
        members_file=path,
        readiness=Readiness("store"),
    )


def loaded(path: Path, me: str = A, urls: tuple[str, ...] = ()) -> Peers:
    found = peers(path, me, urls)
    found._load(json.loads(path.read_text()))
    return found


def test_a_static_membership_file_reads_as_view_one(tmp_path: Path) -> None:
    path = tmp_path / "members.json"
    path.write_text(json.dumps({"v": 1, "sites": {B: "http://b"}}))
    found = loaded(path, urls=("http://a", "http://b"))
    assert found.view == View(1, (A, B))
    assert found.sites == {B: "http://b"}
    assert found.established
    assert found.change is None


def test_a_change_under_way_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "members.json"
    before = peers(path)
    before.sites = {B: "http://b", C: "http://c"}
    before.url = "http://a"
    before.view = View(1, (A, B))
    before.established = True
    change = membership.Change.start(before.view, [A, B, C], 2)
    before.install(before.view, change, (A, B, C), {})
    before.reports[A] = Report.PULLED
    before.reports[B] = Report.READING_NEW  # another site's report is not kept
    before.pulled = {3: {5, 7}, 7: {1}}
    before.save()
    assert not path.with_suffix(".tmp").exists()

    after = loaded(path)
    assert after.view == View(1, (A, B))
    assert after.change == change
    assert after.participants == (A, B, C)
    assert after.reports == {A: Report.PULLED}
    assert after.pulled == {3: {5, 7}, 7: {1}}
    assert after.sites == {B: "http://b", C: "http://c"}
    assert after.url == "http://a"
    assert after.resolved

    after.change = change.reading_new()
    after.finish()
    after.save()
    done = loaded(path)
    assert done.view == View(2, (A, B, C))
    assert done.change is None
    assert done.admitted
