"""``zq journal``: info, verify and export over a journal directory (live or copied)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from zq.cli.common import RET_ERROR, RET_USAGE, fail
from zq.server.config import DEFAULT_DATA, Config
from zq.core.errors import ZqError

journal_app = typer.Typer(help="Inspect, check and export a journal (safe beside a running server).",
                          no_args_is_help=True)
DataOpt = typer.Option(DEFAULT_DATA, "--data", "-d", help="journal directory")


@journal_app.command("info")
def info(data: str = DataOpt) -> None:
    """Size, record counts, oldest and newest bookmarks, recovery points (JSON)."""
    from zq.journal.tools import info as journal_info

    try:
        typer.echo(json.dumps(journal_info(data), indent=2))
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None


@journal_app.command("verify")
def verify(
    data: str = DataOpt,
    config: Optional[str] = typer.Option(None, "--config", "-c", help="zq.toml, for its queues"),
) -> None:
    """Check every record decodes and the state rebuilds; exit 1 if not."""
    from zq.journal.tools import verify as journal_verify

    try:
        queues = Config.load(config).queues if config else []
        report = journal_verify(data, queues)
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    typer.echo(json.dumps(report, indent=2))
    if not report["ok"]:
        raise typer.Exit(RET_ERROR)


@journal_app.command("export")
def export(
    out: str = typer.Argument(..., help="directory to write messages.* and events.* into"),
    data: str = DataOpt,
    fmt: str = typer.Option("jsonl", "--format", help="jsonl | parquet (needs pyarrow)"),
    from_: str = typer.Option("0", "--from", help="0 | now | BOOKMARK | ISO time | duration ago (10m), as for replay"),
    to_seq: Optional[int] = typer.Option(None, "--to", help="stop before this bookmark"),
) -> None:
    """Export messages and delivery events (one row per bookmark)."""
    import time

    from zq.cli.access import parse_from
    from zq.journal.lmdb_journal import LmdbJournal
    from zq.journal.tools import export as journal_export

    start, since_ms = parse_from(from_, int(time.time() * 1000))
    try:
        if start == "now" or since_ms is not None:  # a time: the journal says where it starts
            reader = LmdbJournal(data, readonly=True)
            try:
                start = reader.next_seq() if start == "now" else reader.seq_at_time(since_ms)  # type: ignore[arg-type]
            finally:
                reader.close()
        counts = export_with_progress(lambda progress: journal_export(data, out, fmt, int(start), to_seq, progress),
                                      data)
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    typer.echo(json.dumps(counts))


def export_with_progress(run, data: str):  # type: ignore[no-untyped-def]
    """A bar on stderr while an export reads the journal (only on a terminal: scripts
    and pipes get the counts alone)."""
    import sys

    if not sys.stderr.isatty():
        return run(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zq.journal.tools import open_readonly

    j = open_readonly(data)
    try:
        total = sum(j.counts().values())  # every record; a window (--from/--to) ends the bar early
    finally:
        j.env.close()
    with Progress(TextColumn("exporting records"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("export", total=total)
        return run(lambda done: bar.update(task, completed=done))
