"""Topic and filter rules (API.md, Topics): validation, `+`, `#`, and the `$` rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_topics import rules
from relay_topics.rules import TopicError, topic_matches


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/+", "a", False),
        ("a/+", "a/", True),  # an empty level is a level
        ("+/+", "/x", True),
        ("a/#", "a", True),  # '#' also matches the parent level
        ("a/#", "a/b/c", True),
        ("a/#", "ab", False),
        ("#", "a/b", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("a//b", "a//b", True),
        ("a/b", "a/b/", False),
        # The $ rule: a filter starting with a wildcard never matches a $-topic.
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("+", "$SYS", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("$SYS", "$SYS", True),
        ("a/+", "a/$b", True),  # only the first level counts
        ("#", "x$/a", True),
    ],
)
def test_matching(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize(
    ("topic", "why"),
    [
        ("", "empty"),
        ("a/+", "wildcard"),
        ("a/#", "wildcard"),
        ("a+b", "wildcard"),
        ("a\x00b", "NUL"),
        ("x" * 65_536, "limit"),
        ("\ud800", "UTF-8"),
        (b"a", "string"),
        (None, "string"),
    ],
)
def test_bad_topics(topic: object, why: str) -> None:
    with pytest.raises(TopicError, match=why):
        rules.parse_topic(topic)


@pytest.mark.parametrize(
    ("topic_filter", "why"),
    [
        ("", "empty"),
        ("a/#/b", "last level"),
        ("a#", "whole level"),
        ("a/b+", "whole level"),
        ("++", "whole level"),
        ("a\x00", "NUL"),
    ],
)
def test_bad_filters(topic_filter: str, why: str) -> None:
    with pytest.raises(TopicError, match=why):
        rules.parse_filter(topic_filter)


def test_levels() -> None:
    assert rules.parse_topic("/a//b/") == ("", "a", "", "b", "")
    assert rules.parse_filter("+/#") == ("+", "#")
    assert rules.is_wildcard(("a", "+"))
    assert not rules.is_wildcard(("a", "b"))
    # `levels` splits what was parsed before, the same way, without checking it again.
    assert rules.levels("/a//b/") == rules.parse_topic("/a//b/")
    assert rules.levels("+/#") == rules.parse_filter("+/#")
    assert rules.levels("a/#/b") == ("a", "#", "b")
    assert rules.hidden_from_wildcards(("$SYS", "x"))
    assert not rules.hidden_from_wildcards(("x$", "$SYS"))


@pytest.mark.parametrize(
    ("levels", "why"),
    [((), "at least one level"), (("#", "a"), "last level"), (("a+",), "whole level")],
)
def test_filter_levels_are_checked_like_filter_text(levels: rules.Levels, why: str) -> None:
    """`check_filter_levels` (what `FilterIndex.add` checks) refuses what `parse_filter`
    refuses, with the same words."""
    with pytest.raises(TopicError, match=why):
        rules.check_filter_levels(levels)
    if levels:
        with pytest.raises(TopicError, match=why):
            rules.parse_filter("/".join(levels))
    assert rules.check_filter_levels(("a", "+", "#")) == ("a", "+", "#")


def _reference(topic_filter: str, topic: str) -> bool:
    """Matching by regular expression, written independently of `rules.matches`."""
    if topic_filter[0] in "+#" and topic.startswith("$"):
        return False
    pattern = re.escape(topic_filter).replace(r"\+", "[^/]*")
    if pattern == "\\#":
        pattern = ".*"
    elif pattern.endswith("/\\#"):
        pattern = pattern[:-3] + "(/.*)?"
    return re.fullmatch(pattern, topic, re.DOTALL) is not None


level = st.sampled_from(["a", "b", "", "$x", "c$"])


@given(
    topic=st.lists(level, min_size=1, max_size=4).map("/".join).filter(bool),
    topic_filter=st.lists(st.one_of(level, st.just("+")), min_size=1, max_size=4)
    .flatmap(lambda ls: st.sampled_from(["/".join(ls), "/".join([*ls, "#"])]))
    .filter(bool),
)
def test_matching_agrees_with_a_regular_expression(topic: str, topic_filter: str) -> None:
    assert topic_matches(topic_filter, topic) == _reference(topic_filter, topic)


def _parses(parse: object, text: str) -> bool:
    try:
        parse(text)  # type: ignore[operator]
    except TopicError:
        return False
    return True


_levels = st.lists(st.sampled_from(["a", "", "+", "#", "a+", "#b", "$x", "\x00", "é"]), max_size=5)


@given(_levels.map("/".join))
def test_the_patterns_say_what_the_parsers_say(text: str) -> None:
    """`TOPIC_PATTERN` and `FILTER_PATTERN` (for API schemas) agree with the parsers on
    non-empty text."""
    if text:
        topic_ok = re.fullmatch(rules.TOPIC_PATTERN, text) is not None
        filter_ok = re.fullmatch(rules.FILTER_PATTERN, text) is not None
        assert topic_ok == _parses(rules.parse_topic, text)
        assert filter_ok == _parses(rules.parse_filter, text)
