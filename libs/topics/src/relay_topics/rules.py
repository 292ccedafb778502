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
saying what is wrong; `matches` is only ever given parsed levels, so it cannot fail. `levels`
splits text that was parsed before (by the ingress, or when it was written) without checking it
again.
"""

from __future__ import annotations

MAX_TOPIC_BYTES = 65_535  # MQTT's limit on an encoded topic name or filter

PLUS = "+"
"""A filter level matching exactly one topic level (an empty one too)."""
HASH = "#"
"""A filter's last level matching the rest of the topic (also nothing more)."""

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


def levels(text: str) -> Levels:
    """The levels of a topic or filter already parsed once (no check: the ingress validated it,
    or it was validated when written). O(length)."""
    return tuple(text.split("/"))


def parse_topic(topic: object) -> Levels:
    """The levels of a topic name, or `TopicError`."""
    text = _check_text(topic, "topic")
    if PLUS in text or HASH in text:
        raise TopicError(f"topic {text!r} contains a wildcard (+ or #)")
    return levels(text)


def parse_filter(topic_filter: object) -> Levels:
    """The levels of a topic filter, or `TopicError`."""
    return check_filter_levels(levels(_check_text(topic_filter, "filter")))


def check_filter_levels(filter_levels: Levels) -> Levels:
    """The filter's levels if they make a filter (at least one level, wildcards whole levels,
    `#` last only), or `TopicError`. For levels that did not come from `parse_filter`."""
    if not filter_levels:
        raise TopicError("a filter has at least one level")
    last = len(filter_levels) - 1
    for i, level in enumerate(filter_levels):
        if level in (PLUS, HASH):
            if level == HASH and i != last:
                raise TopicError(f"filter {'/'.join(filter_levels)!r}: '#' must be the last level")
        elif PLUS in level or HASH in level:
            raise TopicError(
                f"filter {'/'.join(filter_levels)!r}: a wildcard must be a whole level ({level!r})"
            )
    return filter_levels


def is_wildcard(levels: Levels) -> bool:
    """Whether the filter has a wildcard level (else it names exactly one topic)."""
    return any(level in (PLUS, HASH) for level in levels)


def hidden_from_wildcards(topic: Levels) -> bool:
    """Whether a filter whose first level is a wildcard cannot match the topic (MQTT 4.7.2:
    its first level starts with `$`)."""
    return topic[0].startswith("$")


def matches(topic_filter: Levels, topic: Levels) -> bool:
    """Whether the parsed filter matches the parsed topic (rules in the module docstring)."""
    if topic_filter[0] in (PLUS, HASH) and hidden_from_wildcards(topic):
        return False
    for i, level in enumerate(topic_filter):
        if level == HASH:
            return True
        if i >= len(topic):
            return False
        if level != PLUS and level != topic[i]:
            return False
    return len(topic) == len(topic_filter)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """`matches` on unparsed strings; raises `TopicError` for either being invalid."""
    return matches(parse_filter(topic_filter), parse_topic(topic))
