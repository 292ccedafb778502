"""Making Apache Kafka's class-data-sharing archive (the JDK's dynamic AppCDS): the classes a node
loads until it serves, parsed and verified once by `./dev setup` (`python -m
relayctl.kafka_classes`), then mapped by every node's JVM (`kafka_broker.prepare`) instead of
read from the jars again. Measured here: a node serves after 2.2 s of CPU instead of 4.7-5.4
(1.5 s instead of 2.4-3.0 on C1 alone), and formatting a log dir takes 0.7-1.0 s instead of 1.7.

Invariants: the archive is made by a real node (formatted in a scratch directory, started,
stopped with SIGTERM so the JVM writes the archive at its exit), under another name; it is
moved into place only after a JVM mapped it with `-Xshare:on`, and its record (size and Java)
is written last, so a node never maps a partial archive. It is made again only when the record
is missing or names another Java or size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from relayctl import kafka_broker, processes

READY_BUDGET_S = 120.0


def java_identity() -> str:
    """What `java -version` prints: the JVM checks an archive's header against its own build,
    so an archive made by another build is useless (ignored, never harmful)."""
    done = subprocess.run(
        [kafka_broker.java(), "-version"], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stderr.strip()


def current() -> bool:
    """Whether the archive in place is whole and made by this Java."""
    try:
        record = json.loads(kafka_broker.class_archive_record().read_text())
        size = kafka_broker.class_archive().stat().st_size
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record == {"size": size, "java": java_identity()}


def make(work: Path) -> Path:
    """Make the archive with a node under `work` and put it in place; `KafkaSetupError` when
    the node does not serve, or the archive it wrote cannot be mapped."""
    archive, record = kafka_broker.class_archive(), kafka_broker.class_archive_record()
    record.unlink(missing_ok=True)  # first: a node maps nothing while the archive changes
    archive.unlink(missing_ok=True)
    written = archive.with_name(archive.name + ".new")
    written.unlink(missing_ok=True)
    host = "127.0.0.1"
    node = kafka_broker.Node(
        1, host, processes.free_port(host), processes.free_port(host), work / "kafka"
    )
    command = kafka_broker.prepare(node, [node])
    log_path = work / "kafka.log"
    with log_path.open("wb") as log:
        broker = subprocess.Popen(
            [command[0], f"-XX:ArchiveClassesAtExit={written}", *command[1:]],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + READY_BUDGET_S
        while kafka_broker.READY_TEXT not in log_path.read_text(errors="replace"):
            if broker.poll() is not None or time.monotonic() > deadline:
                raise kafka_broker.KafkaSetupError(
                    f"the node making it did not serve: {_last_line(log_path)}"
                )
            time.sleep(0.1)
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=READY_BUDGET_S)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
    # The node's own options and classpath (an archive holds for the classpath it was made on),
    # `-version` in place of the main class and its configuration.
    jvm = command[1 : command.index("kafka.Kafka")]
    mapped = subprocess.run(
        [command[0], "-Xshare:on", f"-XX:SharedArchiveFile={written}", *jvm, "-version"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if not written.exists() or mapped.returncode != 0:
        written.unlink(missing_ok=True)
        raise kafka_broker.KafkaSetupError(f"it could not be mapped: {_last_line(log_path)}")
    os.replace(written, archive)
    staged = record.with_name(record.name + ".new")
    staged.write_text(json.dumps({"size": archive.stat().st_size, "java": java_identity()}))
    os.replace(staged, record)
    return archive


def _last_line(log_path: Path) -> str:
    lines = log_path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(the node logged nothing)"


def main() -> int:
    """Make the archive unless the one in place is current. Failing to make it is reported and
    not an error: nodes then start as before, only slower."""
    try:
        if current():
            return 0
        with tempfile.TemporaryDirectory(prefix="relay-kafka-classes-") as work:
            archive = make(Path(work))
    except (kafka_broker.KafkaSetupError, OSError, subprocess.SubprocessError) as error:
        print(f"relayctl: no Kafka class archive, nodes start slower ({error})", file=sys.stderr)
        return 0
    print(f"Kafka class archive: {archive} ({archive.stat().st_size >> 20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
