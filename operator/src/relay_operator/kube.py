"""The Kubernetes API calls the operator makes itself (kopf patches the objects it handles).

Invariant: every call is retried with `backoff.Backoff` while the answer is retryable (409, 429,
5xx, no answer) and reported at once otherwise; patches are JSON merge patches of only the
fields the caller owns, so a retry after a conflict applies the same change again and is
idempotent. The credentials are the ones kopf logged in with (handed over as `Credentials`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from relay_operator import backoff

log = logging.getLogger("relay_operator.kube")


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str | None = None
    ca_path: str | None = None
    ca_data: bytes | None = None
    certificate_path: str | None = None
    private_key_path: str | None = None
    insecure: bool = False
    token_path: str | None = None
    """In a pod: the projected service-account token file, read again on every call (the
    kubelet rotates it; the token read at start would expire)."""


class KubeError(Exception):
    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _verify(credentials: Credentials) -> ssl.SSLContext | bool:
    if credentials.insecure:
        return False
    if not credentials.server.startswith("https"):
        return True
    context = ssl.create_default_context(
        cafile=credentials.ca_path,
        cadata=credentials.ca_data.decode() if credentials.ca_data else None,
    )
    if credentials.certificate_path and credentials.private_key_path:
        context.load_cert_chain(credentials.certificate_path, credentials.private_key_path)
    return context


class Kube:
    """An HTTP client of the API server with retries; one per operator process."""

    def __init__(self, credentials: Credentials, policy: backoff.Backoff) -> None:
        self._credentials = credentials
        self._client = httpx.AsyncClient(
            base_url=credentials.server.rstrip("/"), verify=_verify(credentials), timeout=30.0
        )
        self._policy = policy

    def _auth(self) -> dict[str, str]:
        token = self._credentials.token
        if self._credentials.token_path:
            with open(self._credentials.token_path, encoding="utf-8") as file:
                token = file.read().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def close(self) -> None:
        await self._client.aclose()

    async def get(self, path: str) -> dict[str, Any]:
        return await self._call("GET", path)

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._call(
            "PATCH", path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )

    async def delete(self, path: str) -> None:
        """DELETE; an object already gone (404) is the idempotent outcome."""
        try:
            await self._call("DELETE", path)
        except KubeError as error:
            if error.status != 404:
                raise

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST `body`; None when an object of that name exists already (409 AlreadyExists is
        the idempotent outcome here, not a conflict to retry)."""
        try:
            return await self._call("POST", path, json=body, retry_conflict=False)
        except KubeError as error:
            if error.status == 409:
                return None
            raise

    async def _call(
        self,
        method: str,
        path: str,
        *,
        retry_conflict: bool = True,
        **kwargs: Any,
    ) -> dict[str, Any]:
        delays = iter(self._policy.delays())
        while True:
            status: int | None
            try:
                headers = {**self._auth(), **kwargs.pop("headers", {})}
                response = await self._client.request(method, path, headers=headers, **kwargs)
                status = response.status_code
                if status < 300:
                    body: dict[str, Any] = response.json()
                    return body
                message = _message(response)
            except httpx.TransportError as error:
                status, message = None, f"no answer: {error!r}"
            retry = backoff.retryable(status) and (retry_conflict or status != 409)
            delay = next(delays, None) if retry else None
            if delay is None:
                raise KubeError(status, message)
            log.warning("%s %s answered %s; trying again in %.1f s", method, path, status, delay)
            await asyncio.sleep(delay)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except ValueError:
        return response.text[:500]


def path(
    group: str, version: str, plural: str, namespace: str, name: str = "", sub: str = ""
) -> str:
    """The API path of a namespaced object (or of its collection when `name` is empty)."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return "/".join(p for p in (f"{base}/namespaces/{namespace}/{plural}", name, sub) if p)
