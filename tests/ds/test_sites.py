"""Site ids and replica-set targets (`relay_ds.sites`): one spelling, and each refusal saying
what is wrong."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay_ds.errors import Refused
from relay_ds.sites import SITE_PATTERN, SiteId, check_known, parse_site, parse_target

A = SiteId("00112233AABBCCDD")
B = SiteId("FFFFFFFFFFFFFFFF")


@given(st.text(alphabet="0123456789abcdefABCDEF", min_size=16, max_size=16))
def test_a_site_id_is_stored_in_upper_case(text: str) -> None:
    assert parse_site(text) == text.upper()
    assert parse_site(parse_site(text)) == text.upper()
    assert re.fullmatch(SITE_PATTERN, text)


@pytest.mark.parametrize("bad", ["", "xyz", "0011223344556677" + "8", "00112233AABBCCDG", 7, None])
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(Refused, match=re.escape(f"a site id is 16 hex digits, got {bad!r}")):
        parse_site(bad)


def test_a_target_is_parsed_not_empty_and_names_no_site_twice() -> None:
    assert parse_target(["00112233aabbccdd", B]) == [A, B]
    with pytest.raises(Refused, match=r"^replica set too small: it needs at least one site$"):
        parse_target([])
    with pytest.raises(Refused, match=r"^a replica set names a site twice$"):
        parse_target([A, "00112233aabbccdd"])
    with pytest.raises(Refused, match="16 hex digits, got 'nope'"):
        parse_target([A, "nope"])


def test_unknown_sites_are_all_named() -> None:
    check_known([A], {A})
    with pytest.raises(Refused, match=rf"^unknown sites: {B}, 0000000000000001$"):
        check_known([B, A, SiteId("0000000000000001")], {A})
