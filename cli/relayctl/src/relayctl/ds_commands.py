"""`relayctl ds ...`: the durable storage's sites and replica sets through the `/ds` admin API
of the running suite, as EMQX's `emqx ctl ds ...` (seed 003).

`ds info` prints THIS SITE (the site of the retainer owning partition 0), SITES and SHARDS
exactly as `relay_ds.info.render_info` lays them out, from the merged view of every retainer
(`GET /ds/info`, read back as the `relay_ds.info.DsInfo` the ingress answered with).
`set-replicas`, `join` and `leave` of the storage `kv` change the replicators' membership
(decision 0011, "Membership changes").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import TypeAdapter

from relay_ds.info import DsInfo, render_info
from relayctl import calls

app = typer.Typer(help="Durable storage: sites and replica sets.", no_args_is_help=True)

DataDir = Annotated[Path, typer.Option("--data-dir", help="Where the suite keeps its data.")]
Storage = Annotated[
    str,
    typer.Argument(
        help="The durable storage (database), e.g. messages; kv: the replicators' membership."
    ),
]
Site = Annotated[str, typer.Argument(help="A site id (16 hex digits).")]
TIMEOUT_S = 30.0


def render(body: Any) -> str:
    """The text of `ds info` from the body of `GET /ds/info`."""
    return render_info(TypeAdapter(DsInfo).validate_python(body))


@app.command()
def info(data_dir: DataDir = Path("./var")) -> None:
    """Print THIS SITE, SITES and SHARDS (pending replica changes as +SITE / -SITE)."""
    typer.echo(render(calls.admin(data_dir, "GET", "/ds/info", "ds info", TIMEOUT_S)), nl=False)


@app.command("set-replicas")
def set_replicas(
    storage: Storage,
    site_ids: Annotated[list[str], typer.Argument(help="The new replica set.", metavar="SITE...")],
    data_dir: DataDir = Path("./var"),
) -> None:
    """Set the storage's replica set."""
    path = f"/ds/storages/{storage}/replicas"
    calls.admin(data_dir, "PUT", path, "ds set-replicas", TIMEOUT_S, body=site_ids)
    typer.echo("ok")


@app.command()
def join(storage: Storage, site: Site, data_dir: DataDir = Path("./var")) -> None:
    """Add a replica of the storage on the site."""
    path = f"/ds/storages/{storage}/replicas/{site}"
    calls.admin(data_dir, "PUT", path, "ds join", TIMEOUT_S)
    typer.echo("ok")


@app.command()
def leave(storage: Storage, site: Site, data_dir: DataDir = Path("./var")) -> None:
    """Remove the storage's replica from the site."""
    path = f"/ds/storages/{storage}/replicas/{site}"
    calls.admin(data_dir, "DELETE", path, "ds leave", TIMEOUT_S)
    typer.echo("ok")


@app.command()
def forget(site: Site, data_dir: DataDir = Path("./var")) -> None:
    """Forget a site that is gone and holds no replica."""
    calls.admin(data_dir, "PUT", f"/ds/sites/{site}/forget", "ds forget", TIMEOUT_S)
    typer.echo("ok")
