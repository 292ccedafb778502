"""The `/ds` values (`relay_ds.info`): their JSON as the API answers it (what the services get
from pydantic with `exclude_defaults`), read back as relayctl reads it, and `ds info`'s text."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from relay_ds.info import (
    Description,
    DsInfo,
    KnownSite,
    Replica,
    Retainer,
    Shard,
    Site,
    SiteShard,
    SiteSummary,
    Storage,
    StorageShare,
    Transition,
    render_info,
)
from relay_ds.sites import SiteId

A = SiteId("00112233AABBCCDD")
B = SiteId("FFFFFFFFFFFFFFFF")

INFO = DsInfo(
    this_site=A,
    sites=[SiteSummary(A, "retainer-0", True), SiteSummary(B, "retainer-1", False)],
    storages=[
        Storage(
            "messages",
            [
                Shard("0", [Replica(A, "up")]),
                Shard(
                    "1024",
                    [Replica(B, "down")],
                    [Transition(A, "joining"), Transition(B, "leaving")],
                ),
            ],
        )
    ],
    retainers=[Retainer("retainer-0", A, [0, 2])],
)


def _api(value: object) -> Any:
    return TypeAdapter(type(value)).dump_python(value, mode="json", exclude_defaults=True)


def test_the_api_shapes() -> None:
    assert _api(INFO) == {
        "this_site": A,
        "sites": [
            {"site": A, "node": "retainer-0", "up": True},
            {"site": B, "node": "retainer-1", "up": False},
        ],
        "storages": [
            {
                "name": "messages",
                "shards": [
                    {"id": "0", "replicas": [{"site": A, "status": "up"}]},
                    {
                        "id": "1024",
                        "replicas": [{"site": B, "status": "down"}],
                        "transitions": [
                            {"site": A, "transition": "joining"},
                            {"site": B, "transition": "leaving"},
                        ],
                    },
                ],
            }
        ],
        "retainers": [{"instance": "retainer-0", "site": A, "partitions": [0, 2]}],
    }
    leaving = Site("retainer-1", False, [SiteShard("messages", "1024", "down", "leaving")])
    assert _api(leaving) == {
        "node": "retainer-1",
        "up": False,
        "shards": [
            {"storage": "messages", "id": "1024", "status": "down", "transition": "leaving"}
        ],
    }
    assert _api(Site("gone-0", False, [])) == {"node": "gone-0", "up": False, "shards": []}
    assert _api(Site("n", True, [SiteShard("m", "1", transition="joining")]))["shards"] == [
        {"storage": "m", "id": "1", "transition": "joining"}
    ]


def test_what_relayctl_reads_back_is_the_same_value() -> None:
    adapter = TypeAdapter(DsInfo)
    assert adapter.validate_python(_api(INFO)) == INFO


def test_a_description_travels_whole() -> None:
    """A retainer's answer to `describe`, through JSON (the bus record's data) and back."""
    description = Description(
        site=A,
        node="retainer-0",
        partitions=[0, 2],
        sites=[KnownSite(A, "retainer-0"), KnownSite(B, "gone-0")],
        storages=[StorageShare("messages", [A], [Shard("0", [Replica(A, "up")])])],
    )
    adapter = TypeAdapter(Description)
    data = adapter.dump_python(description, mode="json")
    assert data["storages"][0]["shards"][0]["transitions"] == []  # everything, on the wire
    assert adapter.validate_python(data) == description


def test_ds_info_text() -> None:
    assert render_info(INFO) == (
        "THIS SITE:\n"
        f"{A}\n"
        "\n"
        "SITES:\n"
        f"{A}    'retainer-0'                      up\n"
        f"{B}    'retainer-1'                      down\n"
        "\n"
        "SHARDS:\n"
        "Shard                             Replicas\n"
        f"messages/0                        {A}\n"
        f"messages/1024                     {B} +{A} -{B}\n"
    )
