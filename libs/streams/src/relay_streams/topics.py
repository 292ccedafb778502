"""MQTT topic names and topic filters: parsing, validation and matching (API.md, Topics).

Rules:
- a topic is `/`-separated UTF-8 levels, at least one character, at most `MAX_TOPIC_BYTES`
  bytes encoded, without `+`, `#` or NUL; empty levels are allowed (`a//b`, `/a`);
- a filter has the same shape, and a level of it may be exactly `+` (any one level) or, as the
  last level only, exactly `#` (that level and every deeper one, also none: `a/#` matches `a`);
- a filter whose first level is `+` or `#` does not match a topic whose first level starts
  with `$` (`$SYS/...`, MQTT 4.7.2): such topics are matched only by filters naming their first
  level.

Invariant: `parse_topic` and `parse_filter` either return the levels or raise `TopicError`
saying what is wrong; `matches` is only ever given parsed levels, so it cannot fail.

This module imports nothing from the rest of the package, so the retainer can reuse it (or it can
move to its own lib) without taking the stream store with it.
"""

from __future__ import annotations

MAX_TOPIC_BYTES = 65_535  # MQTT's limit on an encoded topic name or filter

TOPIC_PATTERN = r"^[^+#\x00]+$"
FILTER_PATTERN = r"^(?:(?:\+|[^/+#\x00]*)/)*(?:\+|#|[^/+#\x00]*)$"
"""The rules above as regular expressions (for API schemas), apart from the size limit and
lone surrogates, which a pattern cannot express; `parse_topic` and `parse_filter` decide."""

Levels = tuple[str, ...]


class TopicError(ValueError):
    """A topic name or filter that breaks the rules above."""


def _check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise TopicError(f"{what} must be a string, not {type(text).__name__}")
    if not text:
        raise TopicError(f"{what} is empty")
    if "\x00" in text:
        raise TopicError(f"{what} contains NUL")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise TopicError(f"{what} is not valid UTF-8 (lone surrogate)") from None
    if size > MAX_TOPIC_BYTES:
        raise TopicError(f"{what} is {size} bytes, over the {MAX_TOPIC_BYTES}-byte limit")
    return text


def parse_topic(topic: object) -> Levels:
    """The levels of a topic name, or `TopicError`."""
    text = _check_text(topic, "topic")
    if "+" in text or "#" in text:
        raise TopicError(f"topic {text!r} contains a wildcard (+ or #)")
    return tuple(text.split("/"))


def parse_filter(topic_filter: object) -> Levels:
    """The levels of a topic filter, or `TopicError`."""
    text = _check_text(topic_filter, "filter")
    levels = tuple(text.split("/"))
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level in ("+", "#"):
            if level == "#" and i != last:
                raise TopicError(f"filter {text!r}: '#' must be the last level")
        elif "+" in level or "#" in level:
            raise TopicError(f"filter {text!r}: a wildcard must be a whole level ({level!r})")
    return levels


def is_wildcard(levels: Levels) -> bool:
    return any(level in ("+", "#") for level in levels)


def matches(topic_filter: Levels, topic: Levels) -> bool:
    """Whether the parsed filter matches the parsed topic (rules in the module docstring)."""
    if topic_filter[0] in ("+", "#") and topic[0].startswith("$"):
        return False
    for i, level in enumerate(topic_filter):
        if level == "#":
            return True
        if i >= len(topic):
            return False
        if level != "+" and level != topic[i]:
            return False
    return len(topic) == len(topic_filter)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """`matches` on unparsed strings; raises `TopicError` for either being invalid."""
    return matches(parse_filter(topic_filter), parse_topic(topic))
