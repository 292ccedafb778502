"""Site ids and replica-set targets, as every store and the merged view take them.

A site id is 16 hex digits (EMQX DS), stored and shown in upper case; a replica-set target is a
list of site ids, not empty, naming no site twice, each a site the checker knows.

Invariant: `parse_site` and `parse_target` either return the canonical value or raise `Refused`
saying what is wrong, so a stored site id and a stored target have one spelling.
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence
from typing import NewType

from relay_ds.errors import Refused

SiteId = NewType("SiteId", str)

SITE_PATTERN = r"^[0-9A-Fa-f]{16}$"
"""A site id as a path parameter may spell it (either case; `parse_site` decides)."""
_SITE = re.compile(r"^[0-9A-F]{16}$")


def parse_site(site: object) -> SiteId:
    """A site id in its stored form (upper case), or `Refused`."""
    if not isinstance(site, str) or not _SITE.match(site.upper()):
        raise Refused(f"a site id is 16 hex digits, got {site!r}")
    return SiteId(site.upper())


def parse_target(sites: Sequence[object]) -> list[SiteId]:
    """A new replica-set target (each site parsed, at least one, none twice), or `Refused`.
    Whether the sites are known is `check_known`'s question, asked once they are."""
    parsed = [parse_site(s) for s in sites]
    if not parsed:
        raise Refused("replica set too small: it needs at least one site")
    if len(set(parsed)) != len(parsed):
        raise Refused("a replica set names a site twice")
    return parsed


def check_known(target: Sequence[SiteId], known: Container[SiteId]) -> None:
    """`Refused` naming every site of the target that is not known."""
    unknown = [s for s in target if s not in known]
    if unknown:
        raise Refused(f"unknown sites: {', '.join(unknown)}")
