"""Request checks shared by the topic endpoints (durable streams, publish, retained): each
either returns what it checked or raises the API's 400, before anything reaches Kafka."""

from __future__ import annotations

from relay_ingress.errors import ApiError
from relay_topics import rules as topic_rules

B64U_PATTERN = r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$"
"""Base64url without padding (for API schemas)."""


def bad(detail: str) -> ApiError:
    return ApiError(400, "BAD_REQUEST", detail)


def parse_topic(text: str, where: str = "topic") -> topic_rules.Levels:
    try:
        return topic_rules.parse_topic(text)
    except topic_rules.TopicError as error:
        raise bad(f"{where}: {error}") from None


def parse_filter(text: str) -> topic_rules.Levels:
    try:
        return topic_rules.parse_filter(text)
    except topic_rules.TopicError as error:
        raise bad(f"filter: {error}") from None
