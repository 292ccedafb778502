"""`relay-spark`: run a job from the command line (what `relayctl rebuild` and `relayctl verify`
run).

    relay-spark rebuild --archive DIR|URI [--export DIR] [--epoch E] --out DIR
    relay-spark verify  --archive DIR|URI --export DIR --rebuilt DIR --report DIR
    relay-spark audit   --archive DIR|URI --kafka HOST:PORT[,...] [--topic-prefix P]

`--engine python` runs the plain-Python replay instead of Spark (the reference and the
benchmark's baseline); `--master` picks the Spark master (`local[2]` by default).

`audit` reads the topics with Spark's Kafka connector and checks that the archive covers every
offset Kafka still holds (offsets past the archiver's resume point are only pending).

Exit codes: verify 0 clean, 1 differences that are errors, 2 the archive has gaps or damaged
files; audit 0 clean, 2 gaps; any job 64 for bad arguments or input (one line saying what is
wrong, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import NoReturn

from relay_archive import export, reader, report, tables
from relay_archive.store import ArchiveStore, open_store
from relay_bus import topics

EX_USAGE = 64


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EX_USAGE, f"relay-spark: error: {message}\n")


def _fail(message: str) -> NoReturn:
    print(f"relay-spark: error: {message}", file=sys.stderr)
    raise SystemExit(EX_USAGE)


def _cut(store: ArchiveStore, export_dir: Path | None, epoch: str | None) -> tables.Cut:
    """The export's cut, or (no export) everything archived in `epoch` (the only one if unset):
    each command partition up to its resume point, and the publications' resume points (where
    a retainer restored from it reads on)."""
    try:
        if export_dir is not None:
            cut = export.read_cut(export_dir, export.read_manifest(export_dir))
            if cut.epoch:
                return cut
            known = reader.epochs(store)
            if len(known) != 1:
                _fail(f"{export_dir}: no part names an epoch, and the archive holds {known}")
            return dataclasses.replace(cut, epoch=known[0])
    except export.ExportError as error:
        _fail(str(error))
    known = reader.epochs(store)
    if epoch is None:
        if len(known) != 1:
            _fail(f"the archive holds {len(known)} epochs {known}: name one with --epoch")
        epoch = known[0]
    elif epoch not in known:
        _fail(f"epoch {epoch!r} is not in the archive (it holds {known})")
    offsets = reader.resume_points(store, epoch, topics.QUEUE_COMMANDS)
    resume = reader.resume_points(store, epoch, topics.PUBLICATIONS)
    return tables.Cut(epoch, int(time.time() * 1000), offsets, resume=resume)


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="relay-spark", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("rebuild", "verify"):
        command = commands.add_parser(name)
        command.add_argument("--archive", required=True, help="archive folder or pyarrow.fs URI")
        command.add_argument("--engine", choices=["spark", "python"], default="spark")
        command.add_argument("--master", default="local[2]")
        command.add_argument("--driver-memory", help="the Spark driver's heap (4g)")
        command.add_argument("--export", type=Path, required=name == "verify")
    rebuild_cmd = commands.choices["rebuild"]
    rebuild_cmd.add_argument("--epoch")
    rebuild_cmd.add_argument("--out", type=Path, required=True)
    verify_cmd = commands.choices["verify"]
    verify_cmd.add_argument("--rebuilt", type=Path, required=True)
    verify_cmd.add_argument("--report", type=Path, required=True)
    audit_cmd = commands.add_parser("audit")
    audit_cmd.add_argument("--archive", required=True, help="archive folder or pyarrow.fs URI")
    audit_cmd.add_argument("--kafka", required=True, help="bootstrap servers HOST:PORT[,...]")
    audit_cmd.add_argument("--topic-prefix", default="", help="RELAY_KAFKA__TOPIC_PREFIX")
    audit_cmd.add_argument("--master", default="local[2]")
    audit_cmd.add_argument("--driver-memory", help="the Spark driver's heap (4g)")
    args = parser.parse_args(argv)

    if "://" not in args.archive and not Path(args.archive).is_dir():
        _fail(f"--archive {args.archive}: no such folder")
    store = open_store(args.archive)
    if args.command == "audit":
        _audit(store, args.kafka, args.topic_prefix, args.master, args.driver_memory)
    cut = _cut(store, args.export, getattr(args, "epoch", None))
    started = time.monotonic()
    if args.command == "rebuild":
        from relay_spark import jobs

        if args.engine == "python":
            counts = jobs.rebuild_python(store, cut, args.out)
        else:
            from relay_spark.session import session

            spark = session(args.master, driver_memory=args.driver_memory)
            counts = jobs.rebuild(spark, store, cut, args.out)
        print(json.dumps({"rebuilt": counts, "seconds": round(time.monotonic() - started, 3)}))
        return
    if not args.rebuilt.is_dir():
        _fail(f"--rebuilt {args.rebuilt}: no such folder (run rebuild first)")
    from relay_spark import jobs

    if args.engine == "python":
        code, doc = jobs.verify_python(store, cut, args.rebuilt, args.export)
    else:
        from relay_spark.session import session

        spark = session(args.master, driver_memory=args.driver_memory)
        code, doc = jobs.verify_job(spark, store, cut, args.rebuilt, args.export)
    report.write(args.report, doc)
    print(
        json.dumps({"verdict": doc["verdict"], "counts": doc["counts"], "report": str(args.report)})
    )
    raise SystemExit(code)


def _audit(
    store: ArchiveStore, bootstrap: str, prefix: str, master: str, driver_memory: str | None
) -> NoReturn:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from relay_spark import audit
    from relay_spark.session import session

    try:
        jars = audit.connector_jars()
        code, doc = audit.run(
            session(master, jars=jars, driver_memory=driver_memory), store, bootstrap, prefix
        )
    except audit.AuditError as error:
        _fail(str(error))
    except (Py4JJavaError, PySparkException) as error:  # one line, not a JVM trace
        _fail(f"reading Kafka at {bootstrap} failed: {str(error).strip().splitlines()[0][:300]}")
    print(json.dumps({k: doc[k] for k in ("epoch", "verdict", "counts", "gaps", "pending")}))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
