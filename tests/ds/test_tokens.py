"""The durable-stream names clients hold (`relay_ds.tokens`): one spelling per value, every
damaged or foreign string refused with `BadToken`, round trips exact."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_ds import tokens
from relay_ds.errors import BadToken, Refused
from relay_ds.tokens import GenerationId, Position, ShardId, StaticIndex, Stream, StreamIterator
from relay_durable import codec

ids = st.integers(0, tokens.MAX_TS)
streams = st.builds(
    Stream,
    st.text(max_size=8),
    ids.map(ShardId),
    ids.map(GenerationId),
    ids.map(StaticIndex),
)
iterators = st.builds(
    StreamIterator,
    streams,
    st.text(max_size=8),
    ids,
    st.none() | st.builds(Position, ids, st.integers(0, 2**64 - 1)),
)


@given(streams)
def test_a_stream_string_decodes_to_exactly_what_it_encoded(stream: Stream) -> None:
    assert Stream.from_token(stream.token()) == stream
    with pytest.raises(BadToken, match="not a iterator"):
        StreamIterator.from_token(stream.token())


@given(iterators)
def test_an_iterator_string_decodes_to_exactly_what_it_encoded(iterator: StreamIterator) -> None:
    assert StreamIterator.from_token(iterator.token()) == iterator
    with pytest.raises(BadToken, match="not a stream"):
        Stream.from_token(iterator.token())


@given(st.binary(max_size=64))
def test_any_other_bytes_are_refused_as_a_bad_token(raw: bytes) -> None:
    for text in (codec.b64u(raw), raw.decode("latin-1")):
        try:
            Stream.from_token(text)
        except BadToken:
            continue
        raise AssertionError(f"{text!r} was taken as a stream")


def test_a_bad_token_is_a_refusal_and_database_names_are_checked() -> None:
    assert issubclass(BadToken, Refused)
    assert tokens.parse_name("m_1-x") == "m_1-x"
    for bad in ("", "../x", "a" * 65, 5):
        with pytest.raises(Refused, match="database name"):
            tokens.parse_name(bad)


def test_a_stream_string_has_one_spelling() -> None:
    """Stream and iterator strings decode through `relay_durable.codec`: the same bytes spelled
    with padding or the standard alphabet's `+` and `/` (which the decoder before it took) are
    refused, so a client cannot hand in a second name for one stream."""

    def decoded_before(text: str) -> bytes:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)

    streams = [Stream("m", ShardId(0), GenerationId(1), StaticIndex(n)) for n in range(256)]
    stream = next(
        s for s in streams if len(s.token()) % 4 and ("-" in s.token() or "_" in s.token())
    )
    token = stream.token()
    assert Stream.from_token(token) == stream
    padded = token + "=" * (-len(token) % 4)
    standard = token.replace("-", "+").replace("_", "/")
    for other in (padded, standard):
        assert other != token
        assert decoded_before(other) == codec.unb64u(token)
        with pytest.raises(BadToken, match="base64url"):
            Stream.from_token(other)
