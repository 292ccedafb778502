"""`/v1/kv` and `/admin/kv` at the ingress in process, a test answering in the replicators'
place: the replicator's bodies are `relay_bus.schemas` models, read back as the model of the
operation asked and rendered byte for byte as the replicator built them; any other shape is a
503, never a half-read value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relay_bus import schemas
from tests.services.loopback import Relay

TOKEN = "t0ken"


async def test_a_replicator_answer_of_another_shape_is_a_503_not_a_half_read_value(
    tmp_path: Path, redis_url: str
) -> None:
    answers: list[tuple[int, dict[str, Any] | None]] = []
    asked: list[str] = []

    async with Relay(
        tmp_path, redis_url, queue_writer=False, retainer=False, delivery=False, admin_token=TOKEN
    ) as relay:

        def replicator(record: schemas.KvRequest) -> dict[str, Any]:
            asked.append(record.op)
            status, data = answers.pop(0)
            return {"status": status, "data": data}

        relay.replicator(replicator)
        auth = {"Authorization": "Bearer secret"}

        async def get() -> tuple[int, bytes]:
            found = await relay.http.get("/v1/kv/app/k", headers=auth)
            return found.status_code, found.content

        answers.append((200, {"value": "eA", "version": "1.0.A"}))  # no expires_at
        status, body = await get()
        assert status == 503
        assert b'"unexpected answer: kv_reply data is not a KvRegister' in body
        answers.append((200, None))
        assert await get() == (
            503,
            b'{"error":"UNAVAILABLE","detail":"the replicator answered without a body"}',
        )
        answers.append((200, {"value": "eA", "version": "1.0.A", "expires_at": None}))
        assert await get() == (200, b'{"value":"eA","version":"1.0.A","expires_at":null}')

        answers.append((200, {"version": 7}))  # a view's version, not a write's
        put = await relay.http.put("/v1/kv/app/k", headers=auth, json={"value": "eA"})
        assert put.status_code == 503
        assert put.json()["detail"].startswith(
            "unexpected answer: kv_reply data is not a KvVersion"
        )

        fields = {"fields": [{"field": "f", "value": "", "version": "2.0.A"}], "cursor": "Zg"}
        answers.append((200, fields))
        listed = await relay.http.get("/v1/kv/app/k/fields", headers=auth)
        assert (listed.status_code, listed.content) == (
            200,
            b'{"fields":[{"field":"f","value":"","version":"2.0.A"}],"cursor":"Zg"}',
        )

        made = {"token": "tk", "n": 3, "r": 2, "w": 2, "gc_grace_s": 5}
        answers.append((200, {**made, "extra": 1}))
        admin = {"Authorization": f"Bearer {TOKEN}"}
        path = "/admin/kv/namespaces/app"
        refused = await relay.http.put(path, headers=admin, json={"n": 3})
        assert refused.status_code == 503
        assert "not a KvNamespace" in refused.json()["detail"]
        answers.append((200, made))
        created = await relay.http.put(path, headers=admin, json={"n": 3})
        assert (created.status_code, created.json()) == (200, made)
        assert asked == ["get"] * 3 + ["put", "list_fields", "ns_put", "ns_put"]
        assert answers == []
