"""`relay_durable.outcome.Outcome`: accepted or refused, and `refused` keeps the subclass."""

from __future__ import annotations

from dataclasses import dataclass

from relay_durable.outcome import Outcome


def test_accepted_and_refused() -> None:
    accepted = Outcome(201, {"stored": 2})
    assert accepted.ok
    refused = Outcome.refused(404, "NOT_FOUND", "no such database")
    assert not refused.ok
    assert (refused.status, refused.data, refused.code, refused.detail) == (
        404,
        None,
        "NOT_FOUND",
        "no such database",
    )


def test_refused_builds_the_class_it_is_called_on() -> None:
    @dataclass(frozen=True)
    class Held(Outcome):
        lsn: int | None = None

    refused = Held.refused(403, "FORBIDDEN", "queue suspended")
    assert type(refused) is Held
    assert refused.lsn is None
