"""Status conditions (`type`, `status`, `reason`, `message`, `lastTransitionTime`) as Kubernetes
keeps them.

Invariant: a condition's `lastTransitionTime` changes only when its `status` changes, so a
condition set again with the same status keeps the time it first became so; conditions of other
types are left as they were, in their order. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str


def merge(existing: list[dict[str, Any]] | None, new: Condition, now: str) -> list[dict[str, Any]]:
    """`existing` with `new` set (added at the end when its type is new)."""
    result: list[dict[str, Any]] = []
    found = False
    for condition in existing or []:
        if condition.get("type") != new.type:
            result.append(dict(condition))
            continue
        found = True
        same = condition.get("status") == new.status
        result.append(_entry(new, condition.get("lastTransitionTime", now) if same else now))
    if not found:
        result.append(_entry(new, now))
    return result


def find(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def _entry(condition: Condition, since: str) -> dict[str, Any]:
    return {
        "type": condition.type,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastTransitionTime": since,
    }
