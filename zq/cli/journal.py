"""``zq journal``: info, verify and export over a journal directory (live or copied);
repair and reset, with no server running on it."""

from __future__ import annotations

import json
from typing import Optional

import typer

from zq.cli.common import RET_ERROR, RET_USAGE, fail
from zq.server.config import DEFAULT_DATA, Config
from zq.core.errors import ZqError
from zq.journal.integrity import JournalDamaged

journal_app = typer.Typer(help="Inspect, check and export a journal (safe beside a running server); repair or "
                          "reset one (with no server on it).", no_args_is_help=True)
DataOpt = typer.Option(DEFAULT_DATA, "--data", "-d", help="journal directory")


def unreadable(data: str, exc: Exception) -> typer.Exit:
    """An error no journal check turned into a sentence (it should not happen): still one line."""
    return fail(f"journal {data} cannot be read: {type(exc).__name__}: {exc}")


@journal_app.command("info")
def info(data: str = DataOpt) -> None:
    """Size, record counts, oldest and newest bookmarks, recovery points (JSON)."""
    import lmdb
    import msgspec

    from zq.journal.tools import info as journal_info

    try:
        typer.echo(json.dumps(journal_info(data), indent=2))
    except JournalDamaged as exc:  # the journal's fault, not the command line's
        raise fail(str(exc), RET_ERROR) from None
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    except (lmdb.Error, msgspec.MsgspecError) as exc:
        raise unreadable(data, exc) from None


@journal_app.command("verify")
def verify(
    data: str = DataOpt,
    config: Optional[str] = typer.Option(None, "--config", "-c", help="zq.toml, for its queues"),
) -> None:
    """Check every record (its checksum, its bookmark, that it decodes), the directory's
    mark and that the state rebuilds; name the damaged bookmarks; exit 1 if anything is
    wrong."""
    import lmdb
    import msgspec

    from zq.journal.tools import verify as journal_verify

    try:
        queues = Config.load(config).queues if config else []
        report = journal_verify(data, queues)
    except JournalDamaged as exc:  # the journal's fault, not the command line's
        raise fail(str(exc), RET_ERROR) from None
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    except (lmdb.Error, msgspec.MsgspecError) as exc:
        raise unreadable(data, exc) from None
    typer.echo(json.dumps(report, indent=2))
    if not report["ok"]:
        n = len(report["problems"])
        raise fail(f"journal {data} is not sound ({n} problem{'s' if n != 1 else ''}, listed above), first: "
                   f"{report['problems'][0] if n else '?'}", RET_ERROR)


@journal_app.command("export")
def export(
    out: str = typer.Argument(..., help="directory to write messages.* and events.* into"),
    data: str = DataOpt,
    fmt: str = typer.Option("jsonl", "--format", help="jsonl | parquet (needs pyarrow)"),
    from_: str = typer.Option("0", "--from", help="0 | now | BOOKMARK | ISO time | duration ago (10m), as for replay"),
    to_seq: Optional[int] = typer.Option(None, "--to", help="stop before this bookmark"),
) -> None:
    """Export messages and delivery events (one row per bookmark). From a damaged journal,
    everything that can be read: damaged records are left out, named, and the exit
    status is 1."""
    import time

    import lmdb
    import msgspec

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
    except JournalDamaged as exc:  # the journal's fault, not the command line's
        raise fail(str(exc), RET_ERROR) from None
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    except (lmdb.Error, msgspec.MsgspecError) as exc:
        raise unreadable(data, exc) from None
    typer.echo(json.dumps(counts))
    if "problem" in counts:
        raise fail(counts["problem"], RET_ERROR)


@journal_app.command("repair")
def repair(data: str = typer.Argument(..., help="the journal directory (no zq serve running on it)")) -> None:
    """Copy every sound record of a damaged journal into a new one in its place.

    The damaged data.mdb is kept aside in DIR/damaged-<time>/; damaged records are gone
    (named in the output: a lost message is lost, a lost event means at most a delivery
    made again); the new journal never numbers below a bookmark the old one gave out."""
    import lmdb
    import msgspec

    from zq.journal.tools import repair as journal_repair

    try:
        report = journal_repair(data)
    except ZqError as exc:
        raise fail(str(exc), RET_ERROR) from None
    except (lmdb.Error, msgspec.MsgspecError) as exc:
        raise unreadable(data, exc) from None
    typer.echo(json.dumps(report, indent=2))


@journal_app.command("reset")
def reset(
    data: str = typer.Argument(..., help="the journal directory (no zq serve running on it)"),
    keep: bool = typer.Option(False, "--keep", help="keep data.mdb as it is (a backup restored on purpose) and make "
                              "the directory's mark what it holds (numbering on above the old mark)"),
) -> None:
    """Start a data directory anew, on purpose: zq serve refuses a directory that held a
    journal and now holds an empty, missing or shorter one.

    Without --keep the journal files are moved aside into DIR/reset-<time>/ (nothing is
    deleted) and the next zq serve starts a new, empty journal."""
    from zq.journal.tools import reset as journal_reset

    try:
        report = journal_reset(data, keep=keep)
    except ZqError as exc:
        raise fail(str(exc), RET_ERROR) from None
    typer.echo(json.dumps(report, indent=2))


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
        j.close()
    with Progress(TextColumn("exporting records"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("export", total=total)
        return run(lambda done: bar.update(task, completed=done))
