"""Schemathesis against the running suite's `/openapi.json`: no input, however odd, gets a 5xx,
every response matches the schema, and nothing a fuzzed request does changes a queue it cannot
sign for (checked in the same test, so it never runs against a suite nothing fuzzed)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests import helpers
from tests.api.client import Recipient

pytestmark = pytest.mark.suite

positive_acceptance = schemathesis.checks.positive_data_acceptance
REFUSES_VALID_SHAPES = {
    "POST /v1/ds/{db}/iterators",
    "GET /v1/ds/{db}/next",
    "PUT /ds/sites/{site}/forget",
    "PUT /ds/storages/{ds}/replicas",
    "PUT /ds/storages/{ds}/replicas/{site}",
    "DELETE /ds/storages/{ds}/replicas/{site}",
    "GET /v1/retained",  # cursors are opaque: a well-shaped one this API never gave is 400
    "GET /admin/retained",
    # A schema cannot say which namespace tokens exist (the admin token is not one: 401), nor
    # how many replicator sites there are (a namespace's n above that is 400).
    "PUT /admin/kv/namespaces/{ns}",
    "PUT /v1/kv/{ns}/{key}",
    "GET /v1/kv/{ns}/{key}",
    "DELETE /v1/kv/{ns}/{key}",
    "POST /v1/kv/{ns}/{key}/members",
    "GET /v1/kv/{ns}/{key}/members",
    "PUT /v1/kv/{ns}/{key}/fields/{field}",
    "GET /v1/kv/{ns}/{key}/fields/{field}",
    "DELETE /v1/kv/{ns}/{key}/fields/{field}",
    "GET /v1/kv/{ns}/{key}/fields",
}
SHORTEST_BUDGET_S = 20.0
"""An admin fan-out's `timeout_s` is the caller's own budget: an owner that cannot answer within
a valid but short one (1 s, on two cores shared with other tests) is answered 503 UNAVAILABLE,
which says nothing about input handling. Valid budgets below this are raised to it; invalid ones
(below 1, above the limit, not a number) are sent as generated."""


def test_no_input_gets_a_server_error_and_fuzzing_changes_no_queue(
    running: helpers.Running,
) -> None:
    """Every operation, each with generated cases checked by schemathesis's checks (no 5xx,
    documented status codes and content types, responses that match their schemas). Driven
    through `as_strategy()`: schemathesis's pytest plugin does not run under pytest 9."""
    http = httpx.Client(base_url=running.state.ingress_url, timeout=20)
    canary = Recipient(http).create()
    canary.send(b"canary")
    before = canary.call("GET").json()
    api = schemathesis.openapi.from_url(f"{running.state.ingress_url}/openapi.json")
    headers = {"Authorization": f"Bearer {running.token()}"}
    operations = [result.ok() for result in api.get_all_operations()]
    assert {
        "POST /v1/queues",
        "POST /v1/send/{sender_id}",
        "GET /v1/queues/{recipient_id}",
        "GET /v1/queues/{recipient_id}/head",
        "POST /v1/queues/{recipient_id}/ack",
        "POST /v1/queues/{recipient_id}/suspend",
        "DELETE /v1/queues/{recipient_id}",
        "POST /admin/dump",
        "POST /admin/export",
        "POST /v1/ds/{db}/messages",
        "GET /v1/ds/{db}/streams",
        "POST /v1/ds/{db}/iterators",
        "GET /v1/ds/{db}/next",
        "GET /ds/sites",
        "PUT /ds/storages/{ds}/replicas",
        "POST /v1/publish",
        "GET /v1/retained",
        "GET /v1/retained/message",
        "GET /admin/retained",
        "GET /admin/retained/size",
        "DELETE /admin/retained/message",
        "PUT /admin/kv/namespaces/{ns}",
        "PUT /v1/kv/{ns}/{key}",
        "POST /v1/kv/{ns}/{key}/members",
    } <= {operation.label for operation in operations}
    for operation in operations:
        # A schema cannot say which opaque stream strings or site ids exist: API.md answers
        # 400 for damaged ones and for unknown sites, so schema-valid input may be refused.
        excluded = [] if operation.label not in REFUSES_VALID_SHAPES else [positive_acceptance]
        _fuzz(operation, headers, excluded)
    assert canary.call("GET").json() == before
    assert canary.call("GET", "/head").json()["msg_id"]  # the canary message is still there


def _fuzz(operation: Any, headers: dict[str, str], excluded: list[Any]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case: schemathesis.Case) -> None:
        budget = (case.query or {}).get("timeout_s")
        valid = isinstance(budget, int | float) and not isinstance(budget, bool)
        if valid and 1 <= budget < SHORTEST_BUDGET_S:
            case.query["timeout_s"] = SHORTEST_BUDGET_S
        case.call_and_validate(headers=headers, excluded_checks=excluded)

    check()
