"""The archive audit's rules (`relay_archive.audit`): uncovered offsets below a slot's resume
point are gaps, at or past it pending; only gaps fail the audit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relay_archive import audit

HELD = {("relay.queue.commands", 0): audit.Held(0, 99, 100)}


def test_a_run_straddling_the_resume_point_is_split() -> None:
    code, doc = audit.judge(
        "e1",
        HELD,
        [audit.Uncovered("relay.queue.commands", 0, 40, 59)],
        {("relay.queue.commands", 0): 50},
    )
    assert code == audit.EXIT_GAPS
    assert doc["verdict"] == "gaps"
    assert [(g["first"], g["last"], g["count"]) for g in doc["gaps"]] == [(40, 49, 10)]
    assert [(p["first"], p["last"], p["count"]) for p in doc["pending"]] == [(50, 59, 10)]
    assert doc["counts"] == {"held": 100, "gap_offsets": 10, "pending_offsets": 10}


def test_only_pending_offsets_are_clean() -> None:
    code, doc = audit.judge("e1", HELD, [audit.Uncovered("relay.queue.commands", 0, 90, 99)], {})
    assert code == audit.EXIT_CLEAN
    assert doc["verdict"] == "clean"
    assert doc["pending"][0]["count"] == 10
    assert doc["gaps"] == []


runs = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(0, 50)).map(
        lambda t: audit.Uncovered("t", t[0], t[1], t[1] + t[2])
    ),
    max_size=20,
)


@given(runs, st.dictionaries(st.integers(0, 3), st.integers(0, 1200)))
def test_every_uncovered_offset_is_a_gap_or_pending_never_both(
    uncovered: list[audit.Uncovered], points: dict[int, int]
) -> None:
    resume = {("t", p): point for p, point in points.items()}
    code, doc = audit.judge("e", {}, uncovered, resume)
    total = sum(u.last - u.first + 1 for u in uncovered)
    assert doc["counts"]["gap_offsets"] + doc["counts"]["pending_offsets"] == total
    for gap in doc["gaps"]:
        assert gap["last"] < resume.get(("t", gap["partition"]), 0)
    for pending in doc["pending"]:
        assert pending["first"] >= resume.get(("t", pending["partition"]), 0)
    assert (code == audit.EXIT_GAPS) == bool(doc["gaps"])
