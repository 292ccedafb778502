"""Calls to Relay's admin API (the ingress's `/admin` and `/ds`), with the admin token.

Invariant: a call returns Relay's answer (status and JSON body) whatever its status; only the
absence of an answer (connection refused, timeout) is raised, as `Unreachable`, so the caller
decides what each status means (the rules are in `dumps` and `dsreplicas`).
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
