"""Schemathesis against the running suite's `/openapi.json`: no input, however odd, gets a 5xx,
every response matches the schema, and nothing a fuzzed request does changes a queue it cannot
sign for."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests import helpers
from tests.api.client import Recipient

pytestmark = pytest.mark.suite


@pytest.fixture(scope="module")
def canary(running: helpers.Running) -> Iterator[tuple[Recipient, dict[str, object]]]:
    with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
        r = Recipient(http).create()
        r.send(b"canary")
        yield r, r.call("GET").json()


def test_no_input_gets_a_server_error(
    running: helpers.Running, canary: tuple[Recipient, dict[str, object]]
) -> None:
    """Every operation, each with generated cases checked by schemathesis's checks (no 5xx,
    documented status codes and content types, responses that match their schemas). Driven
    through `as_strategy()`: schemathesis's pytest plugin does not run under pytest 9."""
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
    } <= {operation.label for operation in operations}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers)

        check()


def test_fuzzing_changed_no_queue(
    running: helpers.Running, canary: tuple[Recipient, dict[str, object]]
) -> None:
    recipient, before = canary
    with httpx.Client(base_url=running.state.ingress_url, timeout=20) as http:
        recipient.http = http
        assert recipient.call("GET").json() == before
