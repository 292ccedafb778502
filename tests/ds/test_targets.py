"""The replicated target record (`relay_ds.targets`) and the view that reads it (`relay_ds.view`
with `stored`): a record survives its encoding exactly, a damaged one is refused, only a
storage with a record and a different local target is changed, and once a storage has a record
every rule and every shard's transitions follow it rather than the retainers' own targets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_ds import targets
from relay_ds.errors import Refused, Unknown
from relay_ds.info import Transition
from relay_ds.sites import SiteId
from relay_ds.view import View
from tests.ds.test_view import GONE, SITES, STRANGER, A, B, two_retainers

NODES = st.text(min_size=1, max_size=20)


@given(st.lists(st.sampled_from(SITES), unique=True, min_size=1), st.data())
def test_a_record_decodes_to_what_was_encoded(target: list[SiteId], data: st.DataObject) -> None:
    known = {site: data.draw(NODES) for site in SITES}
    record = targets.record(target, known)
    assert record.replicas == target
    assert record.nodes == {site: known[site] for site in target}
    assert targets.decode(record.encode()) == record


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not JSON"),
        (b"[]", "format 1"),
        (json.dumps({"f": 2, "replicas": [A], "nodes": {A: "a"}}).encode(), "format 1"),
        (json.dumps({"f": 1, "replicas": A, "nodes": {A: "a"}}).encode(), "a list 'replicas'"),
        (json.dumps({"f": 1, "replicas": [], "nodes": {}}).encode(), "replica set too small"),
        (json.dumps({"f": 1, "replicas": [A, A], "nodes": {A: "a"}}).encode(), "twice"),
        (json.dumps({"f": 1, "replicas": ["xyz"], "nodes": {}}).encode(), "16 hex digits"),
        (json.dumps({"f": 1, "replicas": [A, B], "nodes": {A: "a"}}).encode(), "a node for"),
        (json.dumps({"f": 1, "replicas": [A], "nodes": {A: ""}}).encode(), "a node for"),
    ],
)
def test_a_damaged_record_is_refused(raw: bytes, why: str) -> None:
    with pytest.raises(Refused, match=why):
        targets.decode(raw)


def test_only_held_storages_whose_record_differs_change() -> None:
    stored = {
        "same": targets.record([A, B], {A: "a", B: "b"}),
        "moved": targets.record([B], {B: "b"}),
        "elsewhere": targets.record([A], {A: "a"}),
    }
    local = {"same": [A, B], "moved": [A], "unwritten": [A], "reordered": [B, A]}
    stored["reordered"] = targets.record([A, B], {A: "a", B: "b"})
    assert targets.changes(local, stored) == {
        "moved": stored["moved"],
        "reordered": stored["reordered"],
    }
    assert targets.changes(local, {}) == {}


def test_a_stored_target_replaces_the_retainers_own() -> None:
    # Retainer 0 (A) and retainer 1 (B) each hold only themselves; the record names A and GONE.
    plain = two_retainers([A], [B])
    view = View(plain.retainers, {"messages": [A, GONE]})
    assert plain.replicas("messages") == [A, B]
    assert view.targets("messages") == [[A, GONE]]
    assert view.replicas("messages") == sorted([A, GONE])
    assert view.target("messages") == [A, GONE]
    shard0, shard1024 = view.storage("messages").shards
    assert shard0.transitions == [Transition(GONE, "joining")]
    assert shard1024.transitions == [
        Transition(A, "joining"),
        Transition(GONE, "joining"),
        Transition(B, "leaving"),
    ]
    # The rules follow the record: GONE is in its target, so it cannot be forgotten; a record
    # without GONE frees it; the record's only site cannot leave; B is in no target any more.
    with pytest.raises(Refused, match=rf"^site {GONE} is in the replica set of 'messages'$"):
        view.forgettable(GONE)
    only_a = View(plain.retainers, {"messages": [A]})
    assert only_a.forgettable(GONE) == GONE
    with pytest.raises(Refused, match=rf"^replica set too small: {A} is the only site"):
        only_a.check_leaving("messages", A)
    with pytest.raises(Unknown, match=rf"^site {B} is not part of the replica set$"):
        view.check_leaving("messages", B)
    view.check_leaving("messages", GONE)
    # Without a record (migration), the union of the retainers' targets is the start.
    assert plain.target("messages") == [A, B]
    assert two_retainers([A, B], [A, B]).target("messages") == [A, B]
    view.check_target("messages", [A, B, GONE])
    with pytest.raises(Refused, match=rf"^unknown sites: {STRANGER}$"):
        view.check_target("messages", [STRANGER])


def test_a_record_older_than_one_applied_is_not_applied() -> None:
    old = targets.record([A], {A: "a"})
    new = targets.record([B], {B: "b"})
    read = {"messages": targets.Read("0000019a-0001", old), "other": targets.Read("01", new)}
    applied = {"messages": "0000019a-0002"}
    assert targets.not_older(read, applied) == {"other": new}
    assert targets.not_older(read, {"messages": "0000019a-0001"}) == {"messages": old, "other": new}
    assert targets.not_older(read, {}) == {"messages": old, "other": new}
