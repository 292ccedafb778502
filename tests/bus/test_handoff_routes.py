"""`relay_bus.handoff_routes.sliced`: a unit encoded in pieces is the one-call encoding."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relay_bus.handoff_routes import sliced

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(value=_json, depth=st.integers(0, 4))
def test_a_value_encoded_in_pieces_is_its_one_call_encoding(value: Any, depth: int) -> None:
    text = "".join(sliced(value, depth))
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
