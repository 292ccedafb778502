"""Calls to Relay, with the admin token: its admin API (the ingress's `/admin` and `/ds`,
`RelayAdmin`) and the internal routes of a pool's instances (`Instances`).

Invariant: a call returns Relay's answer (status and JSON body) whatever its status, so the
caller decides what each status means (the rules are in `dumps`, `dsreplicas` and `moves`); the
absence of an answer (connection refused, timeout) is raised as `Unreachable` by `RelayAdmin`
and answered as status None by `Instances`.
"""

from __future__ import annotations

from typing import Any

import httpx


class Unreachable(Exception):
    pass


class RelayAdmin:
    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        self._client = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    async def __aenter__(self) -> RelayAdmin:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._client.aclose()

    async def dump(self, timeout_s: float) -> tuple[int, dict[str, Any]]:
        """`POST /admin/dump?wait=true`: 200 once every queue-writer finished its dump, 503
        naming the command partitions whose owner did not answer within `timeout_s`."""
        return await self._call(
            "POST",
            "/admin/dump",
            params={"wait": "true", "timeout_s": f"{timeout_s:g}"},
            wait_s=timeout_s + 10,
        )

    async def ds_info(self) -> tuple[int, dict[str, Any]]:
        return await self._call("GET", "/ds/info")

    async def set_replicas(self, database: str, sites: list[str]) -> tuple[int, dict[str, Any]]:
        return await self._call("PUT", f"/ds/storages/{database}/replicas", json=sites)

    async def _call(
        self, method: str, path: str, wait_s: float | None = None, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        try:
            response = await self._client.request(
                method, path, timeout=wait_s or httpx.USE_CLIENT_DEFAULT, **kwargs
            )
        except httpx.TransportError as error:
            raise Unreachable(f"{method} {path}: no answer ({error!r})") from error
        try:
            body = response.json()
        except ValueError:
            body = {"detail": response.text[:500]}
        return response.status_code, body if isinstance(body, dict) else {"result": body}


class Instances:
    """Calls to the instances of a pool (queue-writer or retainer pods), at their internal
    routes (`/internal/ownership`, `/internal/partitions/...`), with the admin token.

    Unlike `RelayAdmin`, no answer is not raised: it comes back as status None with the reason,
    because for a partition move "no answer" is an answer the move's rules decide on."""

    def __init__(self, token: str) -> None:
        self._client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"})

    async def __aenter__(self) -> Instances:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._client.aclose()

    async def call(
        self,
        url: str,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        timeout_s: float,
    ) -> tuple[int | None, dict[str, Any]]:
        try:
            response = await self._client.request(
                method, f"{url.rstrip('/')}{path}", json=body, timeout=timeout_s
            )
        except httpx.HTTPError as error:
            return None, {"detail": f"{method} {url}{path}: {error!r}"}
        try:
            answer = response.json()
        except ValueError:
            answer = {"detail": response.text[:500]}
        return response.status_code, answer if isinstance(answer, dict) else {"result": answer}
