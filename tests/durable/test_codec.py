"""`relay_durable.codec`: base64url without padding, one spelling per value."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_durable import codec


@given(st.binary(max_size=200))
def test_round_trip_and_the_standard_form(data: bytes) -> None:
    text = codec.b64u(data)
    assert "=" not in text
    assert text == base64.urlsafe_b64encode(data).decode().rstrip("=")
    assert codec.unb64u(text) == data


@pytest.mark.parametrize(
    "text",
    [
        "QQ==",  # padding
        "a+b/",  # the standard alphabet's two characters
        "abcd\n",  # a trailing newline (`$` in a pattern lets it through)
        "ab cd",
        "abcde",  # a length of 1 mod 4 is no byte string
        "é",
    ],
)
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not base64url"):
        codec.unb64u(text)


@given(st.text(alphabet="ABCxyz019-_", max_size=40))
def test_every_string_of_the_alphabet_decodes_unless_its_length_is_1_mod_4(text: str) -> None:
    if len(text) % 4 == 1:
        with pytest.raises(ValueError, match="not base64url"):
            codec.unb64u(text)
    else:
        assert len(codec.unb64u(text)) == len(text) * 3 // 4


@given(st.text(alphabet="ABCxyz019-_+/= \né", max_size=40))
def test_the_pattern_matches_exactly_what_decodes(text: str) -> None:
    """`codec.PATTERN` (the API schemas' base64url) and `unb64u` are one rule."""
    try:
        codec.unb64u(text)
        decodes = True
    except ValueError:
        decodes = False
    assert (re.fullmatch(codec.PATTERN, text) is not None) == decodes
