"""Placement: shards are fixed, replica sets are rendezvous-ranked, and a join moves about
N/(n+1) of the shards (the new site lands in a shard's top N that often) and nothing else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relay_kv import placement

SAMPLE = range(0, placement.SHARDS, 16)  # 4,096 shards spread over the whole range
site_ids = st.text("0123456789abcdef", min_size=16, max_size=16)


@settings(max_examples=15, deadline=None)
@given(st.lists(site_ids, min_size=3, max_size=8, unique=True), site_ids, st.integers(1, 3))
def test_a_join_moves_about_n_over_sites_shards(sites: list[str], joining: str, n: int) -> None:
    if joining in sites:
        return
    moved = placement.moved(sites, [*sites, joining], n, SAMPLE)
    expected = n / (len(sites) + 1)
    assert abs(moved / len(SAMPLE) - expected) < 0.04, (moved, expected)
    # and every moved shard moved to the joining site
    for shard in SAMPLE[:256]:
        before = set(placement.replicas(shard, sites, n).home)
        after = set(placement.replicas(shard, [*sites, joining], n).home)
        assert after == before or (joining in after and len(after - before) == 1)


@given(st.text(max_size=20), st.text(max_size=20))
def test_shards_are_in_range_and_stable(namespace: str, key: str) -> None:
    shard = placement.shard_of(namespace, key)
    assert 0 <= shard < placement.SHARDS
    assert shard == placement.shard_of(namespace, key)


def test_replica_sets_do_not_depend_on_site_order() -> None:
    sites = [f"{i:016x}" for i in range(5)]
    for shard in range(64):
        a = placement.replicas(shard, sites, 3)
        b = placement.replicas(shard, list(reversed(sites)), 3)
        assert a == b
        assert len(set(a.home) | set(a.fallback)) == 5
