"""`relayctl journal ...`: offline maintenance of a queue-writer's journal (stop it first).
`relay_journal` is imported by these commands only, not by every `relayctl`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Queue journal maintenance (run while the queue-writer is stopped).", no_args_is_help=True
)

Root = Annotated[
    Path, typer.Option("--root", help="The journal root (a queue-writer's journal folder).")
]


@contextmanager
def _journal_errors() -> Iterator[None]:
    """A journal refusal (bad layout, damaged root) is one line on stderr and exit 1."""
    from relay_journal import errors

    try:
        yield
    except errors.JournalError as error:
        typer.echo(f"relayctl: journal: {error}", err=True)
        raise typer.Exit(1) from None


def _fragments(text: str) -> tuple[int, ...]:
    try:
        fragments = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise typer.BadParameter("comma-separated lengths, for example 2,2,2,2") from None
    if not fragments or any(n <= 0 for n in fragments):
        raise typer.BadParameter("lengths must be positive")
    return fragments


@app.command()
def migrate(
    root: Root,
    to: Annotated[str, typer.Option("--to", help="New fragment lengths, e.g. 3,3.")],
    limit: Annotated[
        int | None, typer.Option(help="Move at most this many queues, then stop.")
    ] = None,
) -> None:
    """Move queue folders to another path layout. Resumable: run it again to continue."""
    from relay_journal import layout

    with _journal_errors():
        moved, finished = layout.migrate(root, _fragments(to), limit=limit)
    typer.echo(f"moved {moved} queues; {'finished' if finished else 'run again to continue'}")


@app.command()
def check(root: Root) -> None:
    """Open every queue, repair what loading repairs, and report what is damaged."""
    from relay_journal.journal import QueueJournal
    from relay_journal.settings import JournalSettings

    with _journal_errors():
        journal = QueueJournal(JournalSettings(root=root))
        try:
            problems = journal.check()
        finally:
            journal.close()
    for problem in problems:
        typer.echo(problem)
    typer.echo(f"{len(problems)} problems")
    raise typer.Exit(1 if problems else 0)
