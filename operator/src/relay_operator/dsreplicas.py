"""A RelayDsStorage's replica set: the target to PUT, and the status mirrored from `/ds/info`.

Invariant: the target is a pure function of the spec and what Relay reports (explicit `sites`
as given; `pods` the site each named pod hosts now, the one that is up, so a pod whose volume
was replaced is followed to its new site; `replicationFactor` keeps the current replicas whose
site is up, in id order, then adds up sites in id order), so reconciling twice in a row PUTs
the same list and is idempotent; a pod that hosts no site that is up is `Unresolved` (nothing
is PUT, the condition names it); a
400 from Relay is a refusal of this spec, shown in the Reconciled condition with the server's
own message, and is not retried until the spec changes. Pure.
"""

from __future__ import annotations

from typing import Any

from relay_operator import conditions

RECONCILED = "Reconciled"


class Unresolved(ValueError):
    """A spec naming pods that host no site that is up."""


def target(spec: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """The replica set `spec` asks for, given `GET /ds/info` (`info`)."""
    if spec.get("sites"):
        return list(spec["sites"])
    if spec.get("pods"):
        hosted = {s["node"]: s["site"] for s in info.get("sites", []) if s.get("up")}
        missing = [pod for pod in spec["pods"] if pod not in hosted]
        if missing:
            raise Unresolved(
                f"pod(s) {', '.join(missing)} host no site that is up (GET /ds/sites: "
                f"{', '.join(sorted(hosted)) or 'none up'})"
            )
        return sorted(hosted[pod] for pod in spec["pods"])
    factor = int(spec["replicationFactor"])
    up = sorted(s["site"] for s in info.get("sites", []) if s.get("up"))
    current = sorted(set(replicas(info, spec["database"])) & set(up))
    chosen = current[:factor]
    chosen += [s for s in up if s not in chosen][: factor - len(chosen)]
    return sorted(chosen)


def storage(info: dict[str, Any], database: str) -> dict[str, Any] | None:
    return next((s for s in info.get("storages", []) if s.get("name") == database), None)


def replicas(info: dict[str, Any], database: str) -> list[str]:
    """The sites holding a replica of any shard of `database`, sorted."""
    found = storage(info, database) or {"shards": []}
    return sorted({r["site"] for shard in found["shards"] for r in shard.get("replicas", [])})


def mirror(info: dict[str, Any], database: str, wanted: list[str]) -> dict[str, Any]:
    """The status fields copied from Relay: shards, replicas, lost replicas (a replica whose
    site is not up), the target last sent."""
    found = storage(info, database) or {"shards": []}
    up = {s["site"] for s in info.get("sites", []) if s.get("up")}
    shards = [
        {
            "id": str(shard["id"]),
            "replicas": [
                {"site": r["site"], "status": r.get("status", "")} for r in shard["replicas"]
            ],
            "transitions": [
                {"site": t["site"], "transition": t["transition"]}
                for t in shard.get("transitions", [])
            ],
        }
        for shard in found["shards"]
    ]
    lost = sum(1 for shard in found["shards"] for r in shard["replicas"] if r["site"] not in up)
    return {
        "replicas": ",".join(replicas(info, database)),
        "target": wanted,
        "lostReplicas": lost,
        "shards": shards,
    }


def refused(status: int, detail: str) -> conditions.Condition:
    return conditions.Condition(
        RECONCILED, "False", "Refused", f"Relay answered {status}: {detail}"
    )


def accepted(wanted: list[str]) -> conditions.Condition:
    return conditions.Condition(
        RECONCILED, "True", "ReplicasSet", f"replica set {','.join(wanted)} accepted"
    )


def unresolved(error: Unresolved) -> conditions.Condition:
    return conditions.Condition(RECONCILED, "False", "UnknownPods", str(error))


def unreachable(error: str) -> conditions.Condition:
    return conditions.Condition(RECONCILED, "Unknown", "Unreachable", error)
