"""The operator's Kubernetes client against the test API server: retries what says "try again",
reports refusals at once, and reads a rotated service-account token on every call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_operator import backoff, kube
from tests.operator import kube as server
from tests.operator.conftest import NAMESPACE

FAST = backoff.Backoff(attempts=4, base_s=0.01, cap_s=0.05)


@pytest.fixture
def api() -> Iterator[server.Served]:
    with server.serve() as served:
        served.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        served.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "s", "namespace": NAMESPACE},
                "data": {"token": "dA=="},
            }
        )
        yield served


SECRET = kube.path("", "v1", "secrets", NAMESPACE, "s")


async def test_retryable_answers_are_retried_and_refusals_are_not(api: server.Served) -> None:
    client = kube.Kube(kube.Credentials(server=api.url, token="t"), FAST)
    try:
        fault = api.call(lambda s: s.inject("GET", "secrets", [500, 429, 409]))
        assert (await client.get(SECRET))["data"] == {"token": "dA=="}
        assert fault.hits == [500, 429, 409]
        api.call(lambda s: s.inject("GET", "secrets", [503, 503, 503, 503]))
        with pytest.raises(kube.KubeError) as exhausted:
            await client.get(SECRET)
        assert exhausted.value.status == 503  # four tries, all refused
        before = len(api.requests("GET", "secrets"))
        with pytest.raises(kube.KubeError) as missing:
            await client.get(kube.path("", "v1", "secrets", NAMESPACE, "nope"))
        assert missing.value.status == 404
        assert len(api.requests("GET", "secrets")) == before + 1  # not retried
        # An object that exists already is the idempotent outcome of a create.
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
        assert await client.create(kube.path("", "v1", "secrets", NAMESPACE), body) is None
        await client.delete(kube.path("", "v1", "secrets", NAMESPACE, "nope"))  # 404: done
    finally:
        await client.close()


async def test_a_rotated_service_account_token_is_read_on_every_call(
    api: server.Served, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    client = kube.Kube(kube.Credentials(server=api.url, token_path=str(token)), FAST)
    try:
        await client.get(SECRET)
        token.write_text("second\n")
        await client.get(SECRET)
    finally:
        await client.close()
    sent = [r.headers.get("Authorization") for r in api.requests("GET", "secrets")]
    assert sent == ["Bearer first", "Bearer second"]
