"""The retainer's client of the replicated key-value store, for Relay's own namespaces
(`$retained`, `$ds`): admin requests coordinated by the first of `RELAY_RETAINED__REPLICATORS`
that answers (`POST /internal/kv/coordinate`), and scans of one replicator's copies.

Invariant: a request goes to the replicators in order until one answers; a transport error or
an UNAVAILABLE answer (nothing was sent: e.g. a replicator that does not know every peer yet)
tries the next one; any other answer, refusals included, is returned as it came; when none
answers, `KvUnreachable` names what each said.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from relay_bus import schemas


class KvUnreachable(Exception):
    pass


class KvClient:
    def __init__(self, urls: list[str], token: str | None, instance: str, timeout_s: float) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.instance = instance
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(headers=headers, timeout=timeout_s + 2)

    async def close(self) -> None:
        await self.http.aclose()

    async def coordinate(self, ns: str, **fields: Any) -> dict[str, Any]:
        """One admin request on `ns` (a `KvRequest`'s fields), answered by a coordinator."""
        request = schemas.KvRequest(
            id=secrets.token_hex(12),
            origin=self.instance,
            reply_slot=0,
            deadline_ms=schemas.now_ms_() + self.timeout_s * 1000,
            ns=ns,
            admin=True,
            **fields,
        )
        errors = []
        for url in self.urls:
            try:
                response = await self.http.post(
                    f"{url}/internal/kv/coordinate", content=request.model_dump_json()
                )
                response.raise_for_status()
            except httpx.HTTPError as error:
                errors.append(f"{url}: {type(error).__name__}")
                continue
            answer: dict[str, Any] = response.json()
            if answer.get("code") == "UNAVAILABLE":
                errors.append(f"{url}: {answer.get('detail', '')}")
                continue
            return answer
        raise KvUnreachable(f"no replicator answered ({'; '.join(errors) or 'none set'})")
