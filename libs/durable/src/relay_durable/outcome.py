"""What an operation on a store answers its asker: one shape for the queue rules
(`relay_queues.writer`, which add what must be durable first) and the retainer's stream and
retained operations, each turned into its reply record in one place.

Invariant: an outcome is accepted (`code` is None, `data` the answer's body if it has one) or
refused (`code` an API error code, `detail` a sentence for the client, no data); `status` is the
HTTP status the asker answers with either way.

It lives in `relay_durable`, the lowest layer, because the domain lib `relay_queues` and the
services both use it and share no other layer; it imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self


@dataclass(frozen=True)
class Outcome:
    status: int
    """HTTP status of the answer."""
    data: dict[str, Any] | None = None
    code: str | None = None
    """API error code when refused."""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None

    @classmethod
    def refused(cls, status: int, code: str, detail: str) -> Self:
        return cls(status, code=code, detail=detail)
