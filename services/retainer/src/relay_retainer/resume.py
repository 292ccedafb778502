"""A restored retainer's first start: the resume points `relay_archive.restore` left in its
data dir (`resume.json`: per partition, the archive's end when the rebuild read it) become its
group's committed offsets of `relay.publications` before its consumer reads, so it reads on
from exactly where its restored stores end.

Invariants:
- a start whose group committed past a resume point refuses to serve (`StartupError` naming
  the partitions): the lost retainer applied and answered records the archive did not hold
  yet when it was rebuilt, and reading them again cannot bring them back (a request read past
  its deadline is dropped unapplied: its asker may have been told "nothing was stored"). The
  file stays; rebuilding and restoring once the archive has caught up (`relayctl archive
  status`: lag 0 on `relay.publications`) replaces it. Nothing acknowledged is lost silently;
- the offsets are committed before the file is removed, and both happen before the consumer is
  given any partition, so a crash in between commits the same offsets again;
- points of another epoch (the log was lost since the rebuild: the offsets name records that
  no longer exist) are not committed, and are reported.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from relay_archive import restore
from relay_bus import topics
from relay_bus.bus import Bus
from relay_runtime import exits

log = structlog.get_logger(__name__)


async def commit(bus: Bus, group_id: str, data_dir: Path, owned: list[int]) -> None:
    points = restore.read_resume(data_dir)
    if points is None:
        return
    if points.epoch != bus.epoch:
        log.error(
            "restore_resume_of_another_epoch",
            file=str(data_dir / restore.RESUME_FILE),
            restored_epoch=points.epoch,
            epoch=bus.epoch,
        )
        return
    offsets = {p: o for p, o in points.offsets.items() if p in owned}
    committed = await bus.committed_offsets(topics.PUBLICATIONS, group_id, sorted(offsets))
    ahead = {p: c for p, c in committed.items() if c is not None and c > offsets[p]}
    if ahead:
        gaps = ", ".join(f"partition {p}: {offsets[p]} < {c}" for p, c in sorted(ahead.items()))
        raise exits.StartupError(
            f"restored from an archive that ended before what the lost retainer had applied "
            f"(archive end < committed offset: {gaps}); rebuild and restore again once "
            f"`relayctl archive status` shows no lag on {topics.PUBLICATIONS}",
            exits.EXIT_CONFIG,
        )
    await bus.commit_offsets(topics.PUBLICATIONS, group_id, offsets)
    restore.resumed(data_dir)
    uncovered = sorted(set(owned) - set(points.offsets))
    log.info("restore_resumed", offsets=offsets, committed_before=committed, not_restored=uncovered)
