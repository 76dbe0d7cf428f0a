"""``zq`` commands that select and reach messages: query, claim, replay, and the
management commands (groups, purge, move, redrive, ack by filter)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from zq.cli_common import RET_USAGE, EndpointOpt, client_for, fail, message_json
from zq.core.errors import ZqError


def parse_from(text: str, now_ms: int) -> tuple[int | str, int | None]:
    """``--from``: 0 | now | a bookmark | an ISO time | a duration ago ("10m")."""
    from datetime import datetime, timezone

    from zq.config import duration_ms

    t = text.strip()
    if t == "now":
        return "now", None
    if t.isdigit():
        return int(t), None
    try:
        return 0, now_ms - duration_ms(t.lstrip("-"), "--from")
    except ZqError:
        pass
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise fail(f"--from must be 0, now, a bookmark, an ISO time or a duration like 10m; got {text!r}", RET_USAGE) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return 0, int(when.timestamp() * 1000)


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        target: str = typer.Argument(..., help="a topic, a queue (its topics) or a ^regex"),
        from_: str = typer.Option("0", "--from", help="0 | now | BOOKMARK | ISO time | duration ago (10m)"),
        follow: bool = typer.Option(False, "--follow", "-F", help="keep printing new messages"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
        count: Optional[int] = typer.Option(None, "--count", "-n", help="stop after N messages"),
        timeout: Optional[float] = typer.Option(None, "--timeout", "-t", help="with --follow: stop after S seconds without one"),
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Print journaled messages as JSON lines (plain pub/sub: no leases, no acks)."""
        import time

        start, since_ms = parse_from(from_, int(time.time() * 1000))
        with client_for(endpoint) as c:
            try:
                r = c.replay(target, start=start, since_ms=since_ms, follow=follow, filter=filter)
            except ZqError as exc:
                raise fail(str(exc), RET_USAGE) from None
            seen = 0
            with r:
                while count is None or seen < count:
                    try:
                        msg = r.get(timeout)
                    except StopIteration:
                        break
                    if msg is None:
                        break
                    typer.echo(message_json(msg))
                    seen += 1

    @app.command()
    def claim(
        queue: str = typer.Argument(..., help="queue to pull from"),
        limit: int = typer.Option(10, "--limit", "-n", help="at most this many messages"),
        wait: float = typer.Option(0.0, "--wait", "-w", help="seconds to wait for at least one (long poll)"),
        lease: float = typer.Option(30.0, "--lease", help="seconds the claimed messages stay leased"),
        destructive: bool = typer.Option(False, "--destructive", help="remove them as they are taken (at-most-once)"),
        ack: bool = typer.Option(True, "--ack/--no-ack", help="acknowledge after printing; --no-ack returns them"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Pull a batch of messages (JSON lines); exit 1 when none came within --wait.

        Claims end with the connection: without --ack (and not --destructive) the
        messages go back to the queue when the command exits.
        """
        with client_for(endpoint) as c:
            try:
                got = c.claim(queue, limit=limit, wait=wait, lease=lease, destructive=destructive, filter=filter)
            except ZqError as exc:
                raise fail(str(exc), RET_USAGE) from None
            for msg in got:
                typer.echo(message_json(msg))
                if ack and not destructive:
                    msg.ack()
        if not got:
            raise typer.Exit(1)

    @app.command()
    def query(
        queue: str = typer.Argument(..., help="queue to aggregate over (its available messages)"),
        group_by: Optional[list[str]] = typer.Option(None, "--group-by", "-g", help="expression to group by (repeatable)"),
        aggregate: Optional[list[str]] = typer.Option(
            None, "--agg", "-a", help="count | count(E) | sum(E) | avg(E) | min(E) | max(E) (repeatable) [default count]"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
        endpoint: Optional[str] = EndpointOpt,
        as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table"),
    ) -> None:
        """Aggregate available messages, e.g. total value of pending orders per region."""
        with client_for(endpoint) as c:
            try:
                rows = c.query(queue, group_by=group_by or [], aggregates=aggregate or [], filter=filter)
            except ZqError as exc:
                raise fail(str(exc), RET_USAGE) from None
        if as_json:
            for row in rows:
                typer.echo(json.dumps(row, ensure_ascii=False, default=str))
            return
        from rich.console import Console

        from zq.views import rows_table

        Console().print(rows_table(rows, list(group_by or []) + list(aggregate or ["count"])))
