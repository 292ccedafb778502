"""Layouts: the modules that decide how one generation's messages sit in its column family.

As in EMQX DS, a layout module is the only code that reads or writes a generation's records
(apart from the generation's own `\\x00`-prefixed meta and stats keys, kept by `shard`).
A layout is named `<name>/<version>`, and each generation records the layout it was created
with (in `db.json` and in its column family), so data written by an old layout stays readable.

Rule for changing a layout: a module here never changes what it writes or how it reads what it
wrote. A new on-disk format is a new module (`lts_v2.py` as `lts/2`) added to `LAYOUTS`;
a database switches to it for new generations only (`DbSettings.layout`), old generations keep
theirs until they are dropped. An unknown `<name>/<version>` on disk is `UnknownLayout`.
"""

from __future__ import annotations

from relay_streams.errors import BadInput, UnknownLayout
from relay_streams.layouts import base, lts_v1, reference_v1

LAYOUTS: dict[str, base.LayoutModule] = {m.LAYOUT_ID: m for m in (reference_v1, lts_v1)}


def known_layout(layout_id: object) -> str:
    """`layout_id` if this code can create generations with it, else `BadInput`."""
    if not isinstance(layout_id, str) or layout_id not in LAYOUTS:
        raise BadInput(f"unknown layout {layout_id!r}; known: {', '.join(sorted(LAYOUTS))}")
    return layout_id


def layout_module(layout_id: str, where: str) -> base.LayoutModule:
    """The module for a layout found on disk, else `UnknownLayout` naming where it was found."""
    found = LAYOUTS.get(layout_id)
    if found is None:
        raise UnknownLayout(
            f"{where} uses layout {layout_id!r}, which this version cannot read "
            f"(known: {', '.join(sorted(LAYOUTS))}); upgrade, or drop that generation with a "
            f"version that knows it"
        )
    return found
