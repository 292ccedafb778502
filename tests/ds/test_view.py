"""Every retainer's description merged (`relay_ds.view.View`): a hypothesis model of several
retainers' descriptions checks the merge against what each retainer said, whatever order they
are given in; examples pin each rule a change must pass, with the exact refusals."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_ds.errors import Refused, Unknown
from relay_ds.info import (
    Description,
    KnownSite,
    Replica,
    Retainer,
    Shard,
    SiteShard,
    SiteSummary,
    StorageShare,
    Transition,
)
from relay_ds.sites import SiteId
from relay_ds.view import View

SITES = [SiteId(f"{i:016X}") for i in range(1, 7)]
NAMES = ["kv", "messages", "other"]
SPAN = 1024


@st.composite
def descriptions(draw: st.DrawFn) -> list[Description]:
    """1 to 4 retainers, each a distinct site owning `p mod n == k`, knowing itself and some
    other sites, and holding a share of some storages (global shard ids, as the retainer sends
    them: its lowest partition * 1024 + shard, in any order; 10 and more sort apart as text)."""
    n = draw(st.integers(1, 4))
    partitions = draw(st.integers(n, 8))
    live = draw(st.permutations(SITES))[:n]
    out = []
    for k, site in enumerate(live):
        owned = list(range(k, partitions, n))
        others = draw(st.lists(st.sampled_from(SITES), unique=True, max_size=3))
        known = sorted({site, *others})
        nodes = {s: draw(st.sampled_from(["a", "b", "c"])) for s in known}
        nodes[site] = f"retainer-{k}"
        storages = []
        for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3)):
            target = draw(st.lists(st.sampled_from(known), unique=True, min_size=1, max_size=3))
            shards = [
                Shard(
                    str(owned[0] * SPAN + i),
                    [
                        Replica(s, "up" if s == site else "down")
                        for s in draw(st.permutations(known))[:2]
                    ],
                    [
                        Transition(s, draw(st.sampled_from(["joining", "leaving"])))
                        for s in target
                        if s != site
                    ],
                )
                for i in draw(st.permutations(range(draw(st.integers(1, 12)))))
            ]
            storages.append(StorageShare(name, target, shards))
        out.append(
            Description(site, nodes[site], owned, [KnownSite(s, nodes[s]) for s in known], storages)
        )
    return draw(st.permutations(out))


@given(descriptions(), st.data())
def test_the_merge_is_every_retainers_share_in_any_order(
    described: list[Description], data: st.DataObject
) -> None:
    view = View(described)
    by_partition = sorted(described, key=lambda d: d.partitions[0])
    assert View(data.draw(st.permutations(described))).info() == view.info()

    names = sorted({s.name for d in described for s in d.storages})
    assert view.storage_names() == names
    for name in names:
        shares = [s for d in by_partition for s in d.storages if s.name == name]
        shards = view.storage(name).shards
        assert sorted(shards, key=lambda s: s.id) == sorted(
            (shard for share in shares for shard in share.shards), key=lambda s: s.id
        )
        assert [int(s.id) for s in shards] == sorted(int(s.id) for s in shards)
        assert view.targets(name) == [share.replicas for share in shares]
        assert view.replicas(name) == sorted({s for share in shares for s in share.replicas})
    for missing in set(NAMES) - set(names):
        with pytest.raises(Unknown, match=f"unknown storage '{missing}'"):
            view.storage(missing)

    live = {d.site: d for d in described}
    known = {k.site for d in described for k in d.sites}
    assert set(view.known) == known
    for site in known:  # a live site's own node; else the lowest-partition retainer's record
        first = next(k.node for d in by_partition for k in d.sites if k.site == site)
        assert view.known[site] == (live[site].node if site in live else first)
    assert view.summaries() == [SiteSummary(s, view.known[s], s in live) for s in sorted(known)]

    for site in known:
        shown = view.site(site)
        assert (shown.node, shown.up) == (view.known[site], site in live)
        expected = []
        for name in names:
            for shard in view.storage(name).shards:
                status = [r.status for r in shard.replicas if r.site == site]
                transition = [t.transition for t in shard.transitions if t.site == site]
                if status or transition:
                    expected.append(
                        SiteShard(name, shard.id, (status or [None])[0], (transition or [None])[0])
                    )
        assert shown.shards == expected
    for site in set(SITES) - known:
        with pytest.raises(Unknown, match=rf"^unknown site {site}$"):
            view.site(site)

    info = view.info()
    assert info.this_site == by_partition[0].site
    assert info.retainers == [Retainer(d.node, d.site, d.partitions) for d in by_partition]
    assert [s.name for s in info.storages] == names


A, B, GONE, STRANGER = SITES[0], SITES[1], SITES[2], SITES[3]


def two_retainers(target_a: list[SiteId], target_b: list[SiteId]) -> View:
    """Retainer 0 is site A (knows GONE, registered before it went), retainer 1 is site B."""

    def share(site: SiteId, owner: int, target: list[SiteId]) -> StorageShare:
        shards = [Shard(str(owner * SPAN), [Replica(site, "up")])]
        return StorageShare("messages", target, shards)

    return View(
        [
            Description(
                B, "retainer-1", [1, 3], [KnownSite(B, "retainer-1")], [share(B, 1, target_b)]
            ),
            Description(
                A,
                "retainer-0",
                [0, 2],
                [KnownSite(A, "retainer-0"), KnownSite(GONE, "gone-0")],
                [share(A, 0, target_a)],
            ),
        ]
    )


def test_a_site_shown_must_be_known() -> None:
    view = two_retainers([A], [B])
    assert view.known_site(GONE.lower()) == GONE
    with pytest.raises(Unknown, match=rf"^unknown site {STRANGER}$"):
        view.known_site(STRANGER)
    with pytest.raises(Refused, match="16 hex digits"):
        view.known_site("xyz")
    assert view.site(GONE).shards == []
    assert view.site(A).shards == [SiteShard("messages", "0", "up")]


def test_a_target_names_known_sites_of_an_existing_storage() -> None:
    view = two_retainers([A], [B])
    view.check_target("messages", [A, B, GONE])
    with pytest.raises(Refused, match=rf"^unknown sites: {STRANGER}$"):
        view.check_target("messages", [A, STRANGER])
    with pytest.raises(Unknown, match=r"^unknown storage 'nosuchdb'$"):
        view.check_target("nosuchdb", [A, STRANGER])  # the storage first


def test_a_site_joins_when_known() -> None:
    view = two_retainers([A], [B])
    assert view.joining("messages", GONE.lower()) == GONE
    with pytest.raises(Refused, match=rf"^unknown site {STRANGER}$"):
        view.joining("messages", STRANGER)
    with pytest.raises(Unknown, match=r"^unknown storage 'nosuchdb'$"):
        view.joining("nosuchdb", STRANGER)


def test_a_site_leaves_a_set_it_is_in_unless_it_is_a_shares_only_site() -> None:
    view = two_retainers([A, B], [B])
    view.check_leaving("messages", A)
    with pytest.raises(Unknown, match=rf"^site {GONE} is not part of the replica set$"):
        view.check_leaving("messages", GONE)
    with pytest.raises(Refused, match=rf"^replica set too small: {B} is the only site of a share$"):
        view.check_leaving("messages", B)
    with pytest.raises(Unknown, match=r"^unknown storage 'nosuchdb'$"):
        view.check_leaving("nosuchdb", A)


def test_only_a_gone_site_in_no_replica_set_is_forgotten() -> None:
    assert two_retainers([A], [B]).forgettable(GONE.lower()) == GONE
    with pytest.raises(
        Refused,
        match=re.escape(f"site {A} is up (retainer-0); only a site that is gone can be forgotten"),
    ):
        two_retainers([A], [B]).forgettable(A)
    with pytest.raises(Refused, match=rf"^site {GONE} is in the replica set of 'messages'$"):
        two_retainers([A], [B, GONE]).forgettable(GONE)  # in a target
    holding = View(
        [
            Description(
                A,
                "retainer-0",
                [0],
                [KnownSite(A, "retainer-0"), KnownSite(GONE, "gone-0")],
                [
                    StorageShare(
                        "messages", [A], [Shard("0", [Replica(A, "up"), Replica(GONE, "down")])]
                    )
                ],
            )
        ]
    )
    with pytest.raises(Refused, match=rf"^site {GONE} is in the replica set of 'messages'$"):
        holding.forgettable(GONE)  # holds a shard, though no target names it
    with pytest.raises(Unknown, match=rf"^unknown site {STRANGER}$"):
        two_retainers([A], [B]).forgettable(STRANGER)
