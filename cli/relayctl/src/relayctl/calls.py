"""Calls to the running suite's admin API, shared by the commands that make them.

Invariant: a failed call prints one line `relayctl: <what> failed: ...` on stderr and exits 1;
it never prints a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import typer

from relayctl import processes, state


def running(data_dir: Path) -> state.SuiteState:
    """The suite running from `data_dir`, or exit 1."""
    found = state.read_state(data_dir)
    if found is None or not processes.pid_alive(found.pid):
        typer.echo(f"relayctl: no suite is running from {data_dir}", err=True)
        raise typer.Exit(1)
    return found


def admin(
    data_dir: Path,
    method: str,
    path: str,
    what: str,
    timeout_s: float,
    params: dict[str, str] | None = None,
    body: Any = None,
) -> Any:
    """Call an admin endpoint of the running suite (its admin token); see `call`."""
    token = state.admin_token(data_dir)
    return call(data_dir, method, path, what, timeout_s, token, params=params, body=body)


def call(
    data_dir: Path,
    method: str,
    path: str,
    what: str,
    timeout_s: float,
    token: str,
    params: dict[str, str] | None = None,
    body: Any = None,
) -> Any:
    """Call the running suite's ingress with `token` as Bearer and return its JSON (None for an
    empty answer); exit 1 naming `what` failed otherwise."""
    suite = running(data_dir)
    try:
        response = httpx.request(
            method,
            f"{suite.ingress_url}{path}",
            params=params,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )
    except httpx.HTTPError as error:
        typer.echo(f"relayctl: {what} failed: {error}", err=True)
        raise typer.Exit(1) from None
    if not response.is_success:
        typer.echo(f"relayctl: {what} failed: {response.status_code} {response.text}", err=True)
        raise typer.Exit(1)
    return response.json() if response.content else None
