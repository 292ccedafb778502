"""Hybrid logical clock: stamps only grow, whatever the wall clock does; a version from too far
in the future is refused; the text form orders like the versions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_kv.clock import HybridClock, TooFarAhead, Version

SITE = "0123456789ABCDEF"


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1))
def test_ticks_grow_and_pass_what_was_observed(steps: list[tuple[int, int]]) -> None:
    wall = [0]
    clock = HybridClock(SITE, lambda: wall[0], max_ahead_ms=10**7)
    last = clock.tick()
    for now, seen in steps:
        wall[0] = now  # the wall clock may jump back
        clock.observe(Version(seen, 7, "F" * 16))
        stamp = clock.tick()
        assert stamp > last
        assert stamp > Version(seen, 7, "F" * 16)
        last = stamp


@given(st.lists(st.builds(Version, st.integers(0, 2**47), st.integers(0, 0xFFFF), st.just(SITE))))
def test_text_form_orders_like_versions(versions: list[Version]) -> None:
    assert sorted(versions) == sorted(versions, key=str)
    assert all(Version.parse(str(v)) == v for v in versions)


def test_a_version_too_far_ahead_is_refused() -> None:
    clock = HybridClock(SITE, lambda: 1000, max_ahead_ms=500)
    clock.observe(Version(1500, 0, SITE))
    with pytest.raises(TooFarAhead):
        clock.observe(Version(2600, 0, SITE))


def test_many_stamps_in_one_millisecond_stay_unique() -> None:
    clock = HybridClock(SITE, lambda: 5)
    stamps = [clock.tick() for _ in range(70_000)]
    assert len(set(stamps)) == len(stamps)
    assert stamps == sorted(stamps)
