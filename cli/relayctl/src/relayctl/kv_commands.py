"""`relayctl kv ...`: the replicated key-value store of the running suite (seed 004).

- `kv namespace NS` creates a namespace (admin API) and prints its token;
- `kv put NS KEY VALUE --token T` and `kv get NS KEY --token T` go through the ingress's
  `/v1/kv`, as a client would (values given and printed as UTF-8 text);
- `kv divergence` asks every pair of replicators for their tictac hashes (groups, then the
  shards of the groups that differ) and prints, per pair and replication factor, how many
  shards differ and which: all zeros means every pair agrees.

Invariant: a failed call prints one line `relayctl: <what> failed: ...` and exits 1.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from relay_durable.codec import b64u, unb64u
from relay_kv import names, tictac
from relayctl import calls, state

app = typer.Typer(help="Replicated key-value data: namespaces, get/put, divergence.")

DataDir = Annotated[Path, typer.Option("--data-dir", help="Where the suite keeps its data.")]
Token = Annotated[str, typer.Option("--token", help="The namespace's token.")]
TIMEOUT_S = 30.0


@app.command()
def namespace(
    ns: str,
    n: Annotated[int, typer.Option(min=1, max=names.MAX_N)] = 1,
    r: Annotated[int | None, typer.Option(min=1, max=names.MAX_N)] = None,
    w: Annotated[int | None, typer.Option(min=1, max=names.MAX_N)] = None,
    gc_grace_s: Annotated[int, typer.Option(min=0)] = 864_000,
    data_dir: DataDir = Path("./var"),
) -> None:
    """Create a namespace (N may not exceed the replicators) and print its token."""
    body = {"n": n, "r": r, "w": w, "gc_grace_s": gc_grace_s}
    answer = calls.admin(
        data_dir, "PUT", f"/admin/kv/namespaces/{ns}", "kv namespace", TIMEOUT_S, body=body
    )
    typer.echo(answer["token"])


@app.command()
def put(ns: str, key: str, value: str, token: Token, data_dir: DataDir = Path("./var")) -> None:
    """Write a string value; prints its version."""
    body = {"value": b64u(value.encode())}
    answer = calls.call(
        data_dir, "PUT", f"/v1/kv/{ns}/{key}", "kv put", TIMEOUT_S, token, body=body
    )
    typer.echo(answer["version"])


@app.command()
def get(ns: str, key: str, token: Token, data_dir: DataDir = Path("./var")) -> None:
    """Read a string value (quorum read); prints the value and its version."""
    answer = calls.call(data_dir, "GET", f"/v1/kv/{ns}/{key}", "kv get", TIMEOUT_S, token)
    typer.echo(f"{unb64u(answer['value']).decode(errors='replace')}\t{answer['version']}")


def divergence_report(urls: list[str], token: str) -> list[tuple[str, str, int, list[int]]]:
    """(site a, site b, n, differing shards) for every pair of replicators and every n."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(headers=headers, timeout=TIMEOUT_S) as http:
        sites = {url: http.get(f"{url}/internal/kv/site").json()["site"] for url in urls}

        def ask(url: str, path: str, body: dict[str, Any]) -> dict[str, str]:
            response = http.post(f"{url}/internal/kv/tree/{path}", json=body)
            response.raise_for_status()
            found: dict[str, str] = response.json()[path]
            return found

        report = []
        for a, b in combinations(urls, 2):
            for n in range(1, names.MAX_N + 1):
                groups = tictac.differing(
                    ask(a, "groups", {"n": n, "peer": sites[b]}),
                    ask(b, "groups", {"n": n, "peer": sites[a]}),
                )
                shards: list[int] = []
                if groups:
                    shards = tictac.differing(
                        ask(a, "shards", {"n": n, "peer": sites[b], "groups": groups}),
                        ask(b, "shards", {"n": n, "peer": sites[a], "groups": groups}),
                    )
                report.append((sites[a], sites[b], n, shards))
        return report


@app.command()
def divergence(data_dir: DataDir = Path("./var")) -> None:
    """Per pair of replicators and replication factor: the shards whose hashes differ."""
    suite = calls.running(data_dir)
    urls = [
        child.probe_url.removesuffix("/readyz")
        for child in suite.children
        if child.name.startswith("relay-replicator-") and child.probe_url
    ]
    try:
        report = divergence_report(urls, state.admin_token(data_dir))
    except (httpx.HTTPError, KeyError, ValueError) as error:
        typer.echo(f"relayctl: kv divergence failed: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo("SITE A            SITE B            N  DIVERGENT SHARDS")
    for a, b, n, shards in report:
        listed = " ".join(str(s) for s in shards[:10]) + (" ..." if len(shards) > 10 else "")
        typer.echo(f"{a}  {b}  {n}  {len(shards)} {listed}".rstrip())
