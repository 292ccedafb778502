"""The `relayctl` command line (typer): `up`, `status`, `ping`, `dump`, `journal ...`, `ds ...`,
`archive status`, `export`, `rebuild`, `verify`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import httpx
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from relay_bus.config import KafkaSettings
from relayctl import (
    archive_commands,
    calls,
    ds_commands,
    journal_commands,
    kv_commands,
    processes,
    state,
    suite,
)

app = typer.Typer(help="Run and inspect a Relay suite.", no_args_is_help=True, add_completion=False)
console = Console()
app.add_typer(journal_commands.app, name="journal")
app.add_typer(ds_commands.app, name="ds")
app.add_typer(kv_commands.app, name="kv")
archive_commands.register(app)
queue_app = typer.Typer(help="Queues of the running suite.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")

DataDir = Annotated[Path, typer.Option("--data-dir", help="Where the suite keeps its data.")]


@app.command()
def up(
    data_dir: DataDir = Path("./var"),
    host: Annotated[str, typer.Option(help="Interface every process binds.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Ingress port (0: any free port).", min=0, max=65535)
    ] = 8080,
    ingress: Annotated[int, typer.Option(help="Ingress instances.", min=1, max=16)] = 1,
    queue_writers: Annotated[int, typer.Option(help="Queue-writer instances.", min=1, max=64)] = 1,
    delivery: Annotated[int, typer.Option(help="Delivery instances.", min=1, max=64)] = 1,
    retainers: Annotated[int, typer.Option(help="Retainer instances.", min=1, max=64)] = 1,
    replicators: Annotated[int, typer.Option(help="Replicator instances.", min=1, max=64)] = 1,
    partitions: Annotated[
        int, typer.Option(help="Partitions of keyed topics.", min=1, max=256)
    ] = 8,
    ready_timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness.")] = 60.0,
    kafka: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT[,...] of an existing Kafka cluster to use instead of starting one "
            "(TLS and SASL from RELAY_KAFKA__* variables)."
        ),
    ] = None,
) -> None:
    """Start Apache Kafka, Redis and every service; stop them all on Ctrl-C."""
    running = state.read_state(data_dir)
    if running is not None and processes.pid_alive(running.pid):
        typer.echo(
            f"relayctl: a suite is already running from {data_dir} (pid {running.pid})", err=True
        )
        raise typer.Exit(1)
    counts = {
        "ingress": ingress,
        "queue-writer": queue_writers,
        "delivery": delivery,
        "retainer": retainers,
        "replicator": replicators,
        "archiver": 1,
    }
    for name in ("queue-writer", "retainer"):
        if counts[name] > partitions:
            typer.echo(
                f"relayctl: {counts[name]} {name} instances need at least as many partitions",
                err=True,
            )
            raise typer.Exit(2)
    if kafka is not None:
        try:
            KafkaSettings(bootstrap_servers=kafka)
        except ValidationError as error:
            typer.echo(f"relayctl: --kafka {kafka!r}: {error.errors()[0]['msg']}", err=True)
            raise typer.Exit(2) from None
    options = suite.Options(data_dir, host, port, counts, partitions, ready_timeout, kafka)
    raise typer.Exit(suite.Suite(options).run())


@app.command()
def status(data_dir: DataDir = Path("./var")) -> None:
    """Probe every process of the running suite; exit 0 only if all are ready."""
    running = calls.running(data_dir)
    table = Table("process", "pid", "port", "state", "detail")
    all_ready = True
    with httpx.Client(timeout=2.0) as http:
        for child in running.children:
            alive = child.pid is not None and processes.pid_alive(child.pid)
            if child.probe_url is None:
                ready = alive and processes.port_open("127.0.0.1", child.port)
                detail = "accepting connections" if ready else "port closed"
            else:
                try:
                    response = http.get(child.probe_url)
                    ready = response.status_code == 200
                    failing = [k for k, ok in response.json().get("checks", {}).items() if not ok]
                    detail = "ready" if ready else "waiting for " + ", ".join(failing)
                except (httpx.HTTPError, ValueError) as error:
                    ready, detail = False, f"no answer ({type(error).__name__})"
            all_ready &= ready
            table.add_row(
                child.name,
                str(child.pid),
                str(child.port),
                "[green]ready" if ready else "[red]not ready",
                detail,
            )
    console.print(table)
    raise typer.Exit(0 if all_ready else 1)


@app.command()
def ping(data_dir: DataDir = Path("./var")) -> None:
    """Send an admin ping through every service and print each hop's latency."""
    report = calls.admin(data_dir, "GET", "/admin/ping", "ping", 20)
    table = Table("hop to", "instance", "latency ms", "in service ms")
    for hop in report["hops"]:
        table.add_row(
            hop["service"],
            hop["instance"],
            f"{hop['latency_ms']:.1f}",
            f"{hop['processing_ms']:.2f}",
        )
    console.print(table)
    console.print(f"round trip {report['total_ms']:.1f} ms")


@app.command()
def dump(
    data_dir: DataDir = Path("./var"),
    wait: Annotated[
        bool, typer.Option("--wait", help="Return once every dump is written and old files gone.")
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answers.")] = 120.0,
) -> None:
    """Start a store-log dump on every queue-writer (or report the one running)."""
    params = {"timeout_s": str(timeout)} | ({"wait": "true"} if wait else {})
    report = calls.admin(data_dir, "POST", "/admin/dump", "dump", timeout + 5, params)
    columns = ["queue-writer", "partitions", "dump"]
    if wait:
        columns += ["records", "bytes", "pause ms", "total s"]
    table = Table(*columns)
    for writer in report["writers"]:
        row = [writer["instance"], ",".join(map(str, writer["partitions"])), str(writer["dump"])]
        if wait:
            row += [
                str(writer["records"]),
                str(writer["bytes"]),
                f"{writer['pause_ms']:.2f}",
                f"{writer['total_s']:.3f}",
            ]
        table.add_row(*row)
    console.print(table)
    console.print(("finished" if wait else "started") + f": dump {report['dump']}")


@queue_app.command("stats")
def queue_stats(data_dir: DataDir = Path("./var")) -> None:
    """Queues, messages, bytes and open queues, per queue-writer."""
    report = calls.admin(data_dir, "GET", "/admin/queues/stats", "queue stats", 60)
    table = Table("queue-writer", "partitions", "queues", "messages", "bytes", "open queues")
    rows = [*report["writers"], {"instance": "total", "partitions": [], **report["total"]}]
    for row in rows:
        table.add_row(
            row["instance"],
            ",".join(map(str, row["partitions"])),
            *(str(row[key]) for key in ("queues", "messages", "bytes", "open_queues")),
        )
    console.print(table)
