"""Imported by `tests.launcher`'s fork server as it starts, and nowhere else: importing it
imports every service (`relayctl.preload`), once, for each instance to be forked from."""

from __future__ import annotations

from relayctl import preload
from relayctl.suite import SERVICES

LOADED = preload.load_all(SERVICES)
