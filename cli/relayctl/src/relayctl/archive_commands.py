"""`relayctl archive status`, `relayctl export`, `relayctl rebuild`, `relayctl verify`,
`relayctl restore`: the Kafka archive of a local suite, the Spark jobs over it, and a data dir
written back from a rebuild (`relay_archive.restore`, through the engines).

`export` reads stopped queue-writer and retainer data dirs through their engines, so it refuses
while the suite runs from that data dir; `export --online` asks the running suite instead
(`POST /admin/export`: every queue-writer and retainer writes its part under its data dir, at
its own cut, while writes go on; relayctl then copies the parts of the local suite into
`--out`).
`rebuild` and `verify` run `relay-spark` (spark-jobs/) as a child process, so relayctl never
loads Spark itself; their exit codes are the job's (verify: 0 clean, 1 differences, 2 gaps).

Invariant: bad input (no archive, no export, a running suite for `export`) is one line on
stderr and exit 2 (`typer`'s usage code) or 1, and nothing is written. `relay_archive` (Arrow,
the replay) is imported by the commands that use it, not by every `relayctl` (0.4 s of CPU at
each start, `relayctl up` included).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.table import Table

from relayctl import calls, processes, state

console = Console()
archive_app = typer.Typer(help="The suite's Kafka archive.", no_args_is_help=True)
DataDir = Annotated[Path, typer.Option("--data-dir", help="Where the suite keeps its data.")]
Engine = Annotated[
    str, typer.Option(help="spark (local[2], or --master) or python (the plain replay).")
]
Master = Annotated[str, typer.Option(help="Spark master.")]

_LAG = re.compile(r'^relay_archiver_lag_records\{partition="(\d+)",topic="([^"]+)"\} (\S+)$')


def _archive(data_dir: Path) -> Path:
    root = data_dir / "archive"
    if not root.is_dir():
        typer.echo(
            f"relayctl: no archive at {root} (has the suite run with its archiver?)", err=True
        )
        raise typer.Exit(1)
    return root


def _lags(data_dir: Path) -> dict[tuple[str, int], int]:
    """The running archiver's lag per (topic, partition), from its /metrics; {} if not running."""
    running = state.read_state(data_dir)
    if running is None or not processes.pid_alive(running.pid):
        return {}
    found: dict[tuple[str, int], int] = {}
    for child in running.children:
        if child.name.startswith("relay-archiver-") and child.probe_url is not None:
            try:
                text = httpx.get(child.probe_url.replace("/readyz", "/metrics"), timeout=2).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                match = _LAG.match(line)
                if match:
                    found[(match[2], int(match[1]))] = int(float(match[3]))
    return found


@archive_app.command("status")
def status(data_dir: DataDir = Path("./var")) -> None:
    """Files, offsets covered, gaps and bytes per epoch, topic and partition; the running
    archiver's lag. Exit 1 when a file is damaged or a range is missing."""
    from relay_archive import layout, reader
    from relay_archive.store import CorruptArchiveFile, LocalStore

    store = LocalStore(_archive(data_dir))
    lags = _lags(data_dir)
    table = Table("epoch", "topic", "partition", "files", "offsets", "gaps", "MB", "lag")
    whole = True
    for slot, files in sorted(reader.by_slot(store.list_files()).items()):
        damaged = 0
        for f in files:
            try:
                store.read(f, columns=["offset"])
            except CorruptArchiveFile:
                damaged += 1
        cover = layout.coverage(files)
        assert cover is not None
        gaps = ", ".join(f"{a}-{b}" for a, b in cover.gaps) + (
            f" {damaged} damaged" if damaged else ""
        )
        whole &= not gaps
        size = sum((Path(store.root) / f.path).stat().st_size for f in files) / 1e6
        lag = lags.get((slot.topic, slot.partition))
        table.add_row(
            slot.epoch[:12],
            slot.topic,
            str(slot.partition),
            str(len(files)),
            f"{cover.first}-{cover.last}",
            gaps or "-",
            f"{size:.2f}",
            "-" if lag is None else str(lag),
        )
    console.print(table)
    raise typer.Exit(0 if whole else 1)


@archive_app.command("audit")
def audit_command(
    data_dir: DataDir = Path("./var"),
    kafka: Annotated[
        str | None,
        typer.Option(help="Bootstrap servers (default: those of the suite running there)."),
    ] = None,
    topic_prefix: Annotated[
        str | None,
        typer.Option(
            help="RELAY_KAFKA__TOPIC_PREFIX (default: that of the suite running there, else none)."
        ),
    ] = None,
    master: Master = "local[2]",
) -> None:
    """Check with Spark's Kafka connector that the archive covers every offset Kafka still
    holds: exit 0 clean, 2 gaps (offsets the archiver has not reached yet are only pending)."""
    if kafka is None:
        running = state.read_state(data_dir)
        if running is None or not processes.pid_alive(running.pid) or not running.kafka:
            typer.echo(f"relayctl: no suite runs from {data_dir}: pass --kafka", err=True)
            raise typer.Exit(1)
        kafka = running.kafka
        topic_prefix = running.topic_prefix if topic_prefix is None else topic_prefix
    topic_prefix = topic_prefix or ""
    args = ["audit", "--archive", str(_archive(data_dir)), "--kafka", kafka]
    raise typer.Exit(_spark([*args, "--topic-prefix", topic_prefix, "--master", master]))


def register(app: typer.Typer) -> None:
    """Add `archive`, `export`, `rebuild` and `verify` to the relayctl app."""
    app.add_typer(archive_app, name="archive")
    app.command("export")(export_command)
    app.command("rebuild")(rebuild_command)
    app.command("verify")(verify_command)
    app.command("restore")(restore_command)


def export_command(
    out: Annotated[Path, typer.Option("--out", help="Folder to write the export to.")],
    data_dir: DataDir = Path("./var"),
    online: Annotated[
        bool,
        typer.Option("--online", help="Ask the running suite (POST /admin/export); writers go on."),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for --online answers.")] = 120.0,
) -> None:
    """Write the live state of every queue-writer and retainer data dir (suite stopped), or
    with --online every running queue-writer's and retainer's, each at its own cut."""
    from relay_archive import export

    if online:
        _export_online(out, data_dir, timeout)
        return
    running = state.read_state(data_dir)
    if running is not None and processes.pid_alive(running.pid):
        typer.echo(
            f"relayctl: the suite is running from {data_dir} (pid {running.pid}); stop it first: "
            "export reads the stores offline",
            err=True,
        )
        raise typer.Exit(1)
    writers = sorted(data_dir.glob("queue-writer-*"))
    retainers = sorted(data_dir.glob("retainer-*"))
    if not writers:
        typer.echo(f"relayctl: no queue-writer data dir under {data_dir}", err=True)
        raise typer.Exit(1)
    at_ms = int(time.time() * 1000)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for folder in writers:
            cut = export.export_queue_writer(folder, out, folder.name, at_ms)
            typer.echo(f"{folder.name}: cut {cut.offsets} of epoch {cut.epoch}")
        for folder in retainers:
            count = export.export_retainer(folder, out, folder.name)
            typer.echo(f"{folder.name}: {count} retained messages")
    except export.ExportError as error:
        typer.echo(f"relayctl: export: {error}", err=True)
        raise typer.Exit(1) from None
    export.write_manifest(out, at_ms)


def _copy_part(folder: str, out: Path) -> None:
    """One owner's part into `out` (the local suite's pods share this filesystem; on a
    cluster, copy each pod's `exports/<id>/` folder instead)."""
    part = Path(folder)
    for file in sorted(part.rglob("*")):
        if file.is_file():
            target = out / file.relative_to(part)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, target)


def _export_online(out: Path, data_dir: Path, timeout: float) -> None:
    from relay_archive import export

    params = {"timeout_s": str(timeout)}
    report = calls.admin(data_dir, "POST", "/admin/export", "export", timeout + 5, params)
    out.mkdir(parents=True, exist_ok=True)
    for writer in report["writers"]:
        _copy_part(writer["folder"], out)
        typer.echo(
            f"{writer['instance']}: {writer['queues']} queues, {writer['messages']} messages; "
            f"commands waited at most {writer['longest_ms']:.2f} ms"
        )
    for retainer in report["retainers"]:
        _copy_part(retainer["folder"], out)
        typer.echo(
            f"{retainer['instance']}: {retainer['retained']} retained, "
            f"{retainer['streams']} stream messages; cut "
            f"{'exact' if retainer.get('exact') else 'bounded'}; writes went on, "
            f"{retainer.get('writes_during', 0)} waited at most {retainer['pause_ms']:.2f} ms "
            f"({retainer.get('before_ms', 0):.2f} ms in as long a time before)"
        )
    cut = report["cut"]
    typer.echo(f"export {report['export']}: commands {cut['queue_commands']}")
    typer.echo(f"publications from {cut['publications']} to {cut['publications_upto']}")
    export.write_manifest(out, cut["at_ms"])


def _spark(args: list[str]) -> int:
    command = [str(Path(sys.executable).parent / "relay-spark"), *args]
    return subprocess.run(command, check=False).returncode


def rebuild_command(
    out: Annotated[Path, typer.Option("--out", help="Folder for the rebuilt tables.")],
    data_dir: DataDir = Path("./var"),
    from_export: Annotated[
        Path | None, typer.Option("--export", help="Rebuild as of this export's cut.")
    ] = None,
    engine: Engine = "spark",
    master: Master = "local[2]",
) -> None:
    """Rebuild queues and retained messages from the archive (run by Spark)."""
    args = ["rebuild", "--archive", str(_archive(data_dir)), "--out", str(out)]
    if from_export is not None:
        args += ["--export", str(from_export)]
    raise typer.Exit(_spark([*args, "--engine", engine, "--master", master]))


def verify_command(
    from_export: Annotated[
        Path, typer.Option("--export", help="The live state (relayctl export).")
    ],
    rebuilt: Annotated[Path, typer.Option("--rebuilt", help="The rebuild of the same cut.")],
    report: Annotated[Path, typer.Option("--report", help="Folder for report.json and .html.")],
    data_dir: DataDir = Path("./var"),
    engine: Engine = "spark",
    master: Master = "local[2]",
) -> None:
    """Compare the rebuilt state with the export: exit 0 clean, 1 differences, 2 archive gaps."""
    args = ["verify", "--archive", str(_archive(data_dir)), "--export", str(from_export)]
    args += ["--rebuilt", str(rebuilt), "--report", str(report)]
    raise typer.Exit(_spark([*args, "--engine", engine, "--master", master]))


def restore_command(
    service: Annotated[str, typer.Argument(help="queue-writer or retainer")],
    rebuilt: Annotated[Path, typer.Option("--from", help="A rebuild (relayctl rebuild --out).")],
    ordinal: Annotated[int, typer.Option("--ordinal", help="The instance k to restore.", min=0)],
    target: Annotated[Path, typer.Option("--data-dir", help="The new, empty data dir to write.")],
    replicas: Annotated[int, typer.Option(help="n, the number of instances.", min=1)] = 1,
    partitions: Annotated[int, typer.Option(help="Partitions of the keyed topics.", min=1)] = 8,
    stream_shards: Annotated[
        int,
        typer.Option(
            help="Shards of each restored stream database (RELAY_STREAMS__SHARDS).", min=1
        ),
    ] = 4,
) -> None:
    """Write a queue-writer's or retainer's data dir from a rebuild, with the marks that let it
    go on from Kafka; refuses a data dir that already holds stores."""
    from relay_archive import restore

    try:
        if service == "queue-writer":
            done = restore.restore_queue_writer(rebuilt, target, ordinal, replicas, partitions)
            typer.echo(
                f"restored {done.queues} queues, {done.messages} messages "
                f"({done.quota_markers_skipped} quota markers not restored); marks {done.marks}"
            )
        elif service == "retainer":
            done = restore.restore_retainer(
                rebuilt, target, ordinal, replicas, stream_shards, partitions
            )
            typer.echo(
                f"restored {done.retained} retained messages, "
                f"{done.streams} durable-stream messages; resumes at {done.marks}"
            )
        else:
            typer.echo(f"relayctl: restore: {service!r} is not queue-writer or retainer", err=True)
            raise typer.Exit(2)
    except restore.RestoreError as error:
        typer.echo(f"relayctl: restore: {error}", err=True)
        raise typer.Exit(1) from None
