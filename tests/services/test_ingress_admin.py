"""`/admin/queues/stats`, `/admin/dump` and `/admin/export` at the ingress in process: the
owners' results are `relay_bus.schemas` models, built by the queue-writer's and the retainer's
own handlers and read back by the ingress as the model of the operation asked; a result of any
other shape is a 503, never a half-read value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import httpx

from relay_bus import schemas, topics
from relay_bus.consumers import Received
from relay_queues import ids
from tests.services.loopback import PARTITIONS, Recipient, Relay

TOKEN = "t0ken"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
AnswerT = TypeVar("AnswerT", bound=schemas.AdminAnswer)


def _results(relay: Relay, request_id: str) -> list[schemas.AdminReply]:
    found = [reply for reply, _ in relay.bus.answers(request_id)]
    assert all(isinstance(reply, schemas.AdminReply) for reply in found)
    return found  # type: ignore[return-value]


def _result(replies: list[schemas.AdminReply], model: type[AnswerT]) -> AnswerT:
    """The one result every partition's reply carries (the operation ran once), as `model`."""
    first, *others = [reply.answer(model) for reply in replies]
    assert others == [first] * (PARTITIONS - 1)
    assert list(replies[0].result) == list(model.model_fields)  # every field, in order
    return first


def _request_id(relay: Relay, op: str, topic: str = topics.QUEUE_COMMANDS) -> str:
    [request_id] = {
        r.id for r, _ in relay.bus.on(topic) if isinstance(r, schemas.AdminRequest) and r.op == op
    }
    return request_id


async def test_the_owners_results_are_their_models_and_the_reports_are_built_from_them(
    tmp_path: Path, redis_url: str
) -> None:
    async with Relay(tmp_path, redis_url, delivery=False, admin_token=TOKEN) as relay:
        created = await relay.http.post("/v1/queues", json={"recipient_key": Recipient().public})
        sender = created.json()["sender_id"]
        for body in (b"a", b"bc"):
            sent = await relay.http.post(f"/v1/send/{sender}", json={"body": ids.b64u(body)})
            assert sent.status_code == 201, sent.text

        stats = await relay.http.get("/admin/queues/stats", headers=ADMIN)
        assert stats.status_code == 200, stats.text
        replies = _results(relay, _request_id(relay, "stats"))
        assert sorted(r.partition for r in replies) == list(range(PARTITIONS))
        result = _result(replies, schemas.QueueWriterStats)
        assert (result.queues, result.messages) == (1, 2)
        assert stats.json() == {
            "writers": [
                {"instance": "queue-writer-0", "partitions": [0, 1, 2, 3], **result.model_dump()}
            ],
            "total": result.model_dump(),
        }

        dumped = await relay.http.post("/admin/dump?wait=true", headers=ADMIN)
        assert dumped.status_code == 200, dumped.text
        finished = _result(_results(relay, _request_id(relay, "dump")), schemas.DumpFinished)
        assert finished.records == 1
        [writer] = dumped.json()["writers"]
        assert writer == {
            "instance": "queue-writer-0",
            "partitions": [0, 1, 2, 3],
            **finished.model_dump(),
        }

        exported = await relay.http.post("/admin/export", headers=ADMIN)
        assert exported.status_code == 202, exported.text
        report = exported.json()
        request_id = _request_id(relay, "export")
        assert report["export"] == request_id
        queue_part = _result(_results(relay, request_id), schemas.QueuePart)
        retainer_request = _request_id(relay, "export", topics.PUBLICATIONS)
        retainer_part = _result(_results(relay, retainer_request), schemas.RetainerPart)
        assert (queue_part.queues, queue_part.messages) == (1, 2)
        assert retainer_part.exact
        epoch = queue_part.epoch
        assert report["cut"]["epoch"] == epoch == retainer_part.epoch
        shown = [("queue-writer-0", queue_part), ("retainer-0", retainer_part)]
        assert [report["writers"], report["retainers"]] == [
            [{"instance": i, "partitions": [0, 1, 2, 3], **p.model_dump(exclude={"epoch"})}]
            for i, p in shown
        ]


async def test_an_owners_result_of_another_shape_is_a_503_not_a_half_read_value(
    tmp_path: Path, redis_url: str
) -> None:
    results: list[dict[str, Any]] = []

    async with Relay(
        tmp_path, redis_url, queue_writer=False, retainer=False, delivery=False, admin_token=TOKEN
    ) as relay:

        async def queue_writer(received: Received) -> None:
            """Answers each copy of a request with the result at the head of `results`."""
            record = received.record
            assert isinstance(record, schemas.AdminRequest)
            reply = schemas.AdminReply(
                id=record.id,
                origin=record.origin,
                partition=received.partition,
                instance="queue-writer-x",
                result=results[0],
            )
            relay.bus.post(topics.INGRESS_INBOX, reply, partition=record.reply_slot)

        relay.bus.subscribe(topics.QUEUE_COMMANDS, queue_writer)

        async def ask(method: str, path: str, result: dict[str, Any]) -> httpx.Response:
            results[:] = [result]
            return await relay.http.request(method, path, headers=ADMIN)

        counts = {"queues": 1, "messages": 2, "bytes": 3, "open_queues": 0}
        refused = await ask("GET", "/admin/queues/stats", {**counts, "extra": 4})
        assert refused.status_code == 503
        assert refused.json()["detail"].startswith(
            "unexpected answer: admin_reply data is not a QueueWriterStats"
        )
        shown = await ask("GET", "/admin/queues/stats", counts)
        assert (shown.status_code, shown.content) == (
            200,
            json.dumps(
                {
                    "writers": [
                        {"instance": "queue-writer-x", "partitions": [0, 1, 2, 3], **counts}
                    ],
                    "total": counts,
                },
                separators=(",", ":"),
            ).encode(),
        )

        done = {"dump": 5, "records": 1, "bytes": 9, "pause_ms": 0.5, "total_s": 0.25}
        refused = await ask("POST", "/admin/dump", done)  # a finished dump, not asked for
        assert refused.status_code == 503
        assert "admin_reply data is not a DumpStarted" in refused.json()["detail"]
        refused = await ask("POST", "/admin/dump?wait=true", {"dump": 5})
        assert refused.status_code == 503
        assert "admin_reply data is not a DumpFinished" in refused.json()["detail"]
        started = await ask("POST", "/admin/dump", {"dump": 5})
        assert (started.status_code, started.content) == (
            202,
            b'{"dump":5,"writers":[{"instance":"queue-writer-x","partitions":[0,1,2,3],"dump":5}]}',
        )
