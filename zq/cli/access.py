"""``zq`` commands that select and reach messages: query, claim, replay, and the
management commands (groups, purge, move, redrive, ack by filter)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from zq.cli.common import RET_USAGE, EndpointOpt, client_for, fail, message_json
from zq.core import limits
from zq.core.errors import ZqError


def parse_from(text: str, now_ms: int) -> tuple[int | str, int | None]:
    """``--from``: 0 | now | a bookmark | an ISO time | a duration ago ("10m")."""
    from datetime import datetime, timezone

    from zq.server.config import duration_ms

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
        count: Optional[int] = typer.Option(None, "--limit", "--count", "-n", help="stop after N messages"),
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
            except (ZqError, ValueError) as exc:  # (ValueError: an argument out of range, said in one line)
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
        group_by: Optional[list[str]] = typer.Option(None, "--group-by", "-G", help="expression to group by (repeatable)"),
        aggregate: Optional[list[str]] = typer.Option(
            None, "--agg", "-a", help="count | count(E) | sum(E) | avg(E) | min(E) | max(E) (repeatable) (default count)"),
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
        from zq.cli.views import print_rows

        print_rows(rows, list(group_by or []) + list(aggregate or ["count"]))


def confirm_or_stop(what: str, yes: bool) -> None:
    """Destructive commands ask first; without a terminal they need --yes."""
    import sys

    if yes:
        return
    if not sys.stdin.isatty():
        raise fail(f"{what}: add --yes to confirm (no terminal to ask on)", RET_USAGE)
    if not typer.confirm(f"{what}?", default=False):
        raise typer.Exit(1)


def available(c, queue: str, filter: str | None, group: str | None = None) -> int:  # type: ignore[no-untyped-def]
    """How many available messages a destructive command would touch (for the question)."""
    if group is not None:
        return sum(g["pending"] for g in c.groups(queue, limit=10**9) if g["group"] == group)
    rows = c.query(queue, aggregates=["count"], filter=filter)
    return rows[0]["count"] if rows else 0


def confirmed_action(endpoint, queue, filter, group, yes, question, done, action):  # type: ignore[no-untyped-def]
    """Count what a destructive action would touch, ask (unless --yes), do it, report."""
    with client_for(endpoint) as c:
        try:
            n = available(c, queue, filter, group)
            confirm_or_stop(question.format(n=n, queue=queue), yes)
            typer.echo(f"{done} {action(c)}")
        except ZqError as exc:
            raise fail(str(exc), RET_USAGE) from None


YesOpt = typer.Option(False, "--yes", "-y", help="do not ask for confirmation")


def run(fn):  # type: ignore[no-untyped-def]
    """``fn()``, its ZqError said in one line with the usage exit status."""
    try:
        return fn()
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None


def register_management(app: typer.Typer) -> None:
    """The operator's commands: reading a queue (groups, explain), bulk actions on its
    available messages (purge, move, redrive, ack by filter) and ``zq queue``."""
    register_reading(app)
    register_bulk_actions(app)
    queue_app = typer.Typer(help="Declare and delete queues at run time (journaled; zq.toml wins).", no_args_is_help=True)
    app.add_typer(queue_app, name="queue")
    register_queue_list(queue_app)
    register_queue_create(queue_app)
    register_queue_alter(queue_app)
    register_queue_delete(queue_app)


def register_reading(app: typer.Typer) -> None:
    @app.command()
    def groups(
        queue: str = typer.Argument(..., help="a queue with message groups"),
        limit: int = typer.Option(50, "--limit", "-n", help="at most this many groups (busiest first)"),
        endpoint: Optional[str] = EndpointOpt,
        as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table"),
    ) -> None:
        """List a queue's groups with pending and in-flight counts and their holders."""
        with client_for(endpoint) as c:
            rows = run(lambda: c.groups(queue, limit))
        if as_json:
            for row in rows:
                typer.echo(json.dumps(row))
            return
        from zq.cli.views import print_rows

        print_rows(rows, ["group", "pending", "in_flight", "holder"])

    @app.command()
    def explain(
        queue: str = typer.Argument(..., help="the queue the message is in"),
        message: str = typer.Argument(..., metavar="BOOKMARK|MSG_ID",
                                      help="the message's bookmark (a number), or the msg_id it was published with"),
        msg_id: bool = typer.Option(False, "--msg-id", help="read MESSAGE as a msg_id even if it is a number"),
        topic: Optional[str] = typer.Option(None, "--topic", help="the topic a MSG_ID was published to "
                                            "(default: the queue's name)"),
        endpoint: Optional[str] = EndpointOpt,
        as_json: bool = typer.Option(False, "--json", help="the whole answer as JSON"),
    ) -> None:
        """Say why a message is where it is (leased by whom until when, or what holds it
        back), with its delivery history from the journal."""
        by_bookmark = message.isdigit() and not msg_id
        with client_for(endpoint) as c:
            doc = run(lambda: c.explain(queue, int(message) if by_bookmark else None,
                                        msg_id=None if by_bookmark else message, topic=topic))
        if as_json:
            typer.echo(json.dumps(doc))
            return
        from zq.cli.views import explain_text

        typer.echo(explain_text(doc))


def register_bulk_actions(app: typer.Typer) -> None:
    @app.command()
    def purge(
        queue: str = typer.Argument(..., help="the queue to purge"),
        group: Optional[str] = typer.Option(None, "--group", "-g", help="only this group's messages"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
        yes: bool = YesOpt,
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Delete available messages of a queue (leased ones are left alone)."""
        confirmed_action(endpoint, queue, filter, group, yes, "purge {n} available messages from {queue!r}", "purged",
                         lambda c: c.purge(queue, filter=filter, group=group))

    @app.command()
    def move(
        queue: str = typer.Argument(..., help="the queue to take them from"),
        to: str = typer.Argument(..., help="topic to republish them to"),
        group: Optional[str] = typer.Option(None, "--group", "-g", help="only this group's messages"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
        yes: bool = YesOpt,
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Move available messages to another topic (copies, then removed here)."""
        confirmed_action(endpoint, queue, filter, group, yes, "move {n} available messages from {queue!r} to " + repr(to),
                         "moved", lambda c: c.move(queue, to, filter=filter, group=group))

    @app.command()
    def redrive(
        queue: str = typer.Argument(..., help="a dead-letter queue"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only dead letters matching this expression"),
        yes: bool = YesOpt,
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Send dead letters back to the topic they came from (same id and headers)."""
        confirmed_action(endpoint, queue, filter, None, yes, "redrive {n} dead letters from {queue!r}", "redriven",
                         lambda c: c.redrive(queue, filter=filter))

    @app.command("ack")
    def ack_by_filter(
        queue: str = typer.Argument(..., help="the queue to acknowledge messages of"),
        filter: str = typer.Option(..., "--filter", "-f", help="acknowledge the messages matching this expression"),
        yes: bool = YesOpt,
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Acknowledge (remove) available messages matching a filter."""
        confirmed_action(endpoint, queue, filter, None, yes, "acknowledge {n} available messages of {queue!r}",
                         "acknowledged", lambda c: c.ack_filter(queue, filter))


def register_queue_list(queue_app: typer.Typer) -> None:
    @queue_app.command("list")
    def queue_list(
        as_json: bool = typer.Option(False, "--json", help="print every setting of every queue as JSON"),
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """The queues the dispatcher has: kind, topics, semantics, depth."""
        with client_for(endpoint) as c:
            queues, st = run(c.queues), run(c.stats)
        if as_json:
            typer.echo(json.dumps(queues, indent=2))
            return
        from zq.cli.views import print_table, queue_rows

        print_table(*queue_rows(queues, st.get("queues", {})))


def register_queue_create(queue_app: typer.Typer) -> None:
    @queue_app.command("create")
    def queue_create(
        name: str = typer.Argument(..., help="the queue's name (and its topic, unless --topics says otherwise)"),
        topics: Optional[str] = typer.Option(None, "--topics", help="regex over topics (default: the name)"),
        semantics: str = typer.Option("at-least-once", "--semantics", help="at-least-once (leases) or at-most-once"),
        fairness: Optional[str] = typer.Option(None, "--fairness", help="fast | round-robin | proportional: how a "
                                               "message picks among consumers with credit (default: proportional; "
                                               "round-robin for at-most-once)"),
        lease: str = typer.Option("30s", "--lease", help="how long a consumer holds a message before it comes back"),
        max_backlog: int = typer.Option(100, "--max-backlog", help="unacknowledged messages one subscription may hold"),
        max_cancels: int = typer.Option(0, "--max-cancels", help="cancels before a message is dead-lettered (0: no limit)"),
        max_deliveries: int = typer.Option(20, "--max-deliveries", help="deliveries before a message is dead-lettered "
                                           "(0: no limit)"),
        expiration: Optional[str] = typer.Option(None, "--expiration", help="a message older than this is "
                                                 "dead-lettered (default: never)"),
        dead_letter: Optional[str] = typer.Option(None, "--dead-letter", help="topic that receives dead letters, with "
                                                  "the reason (default: NAME.dead)"),
        no_dead_letter: bool = typer.Option(False, "--no-dead-letter", help="drop dead letters instead"),
        group_header: Optional[str] = typer.Option("group", "--group-header", help="the header that holds a message's "
                                                   "group id"),
        group_policy: str = typer.Option("sequenced", "--group-policy", help="sequenced | exclusive | one-in-flight; sequenced: one consumer holds a group "
                                         "until it acks what it holds; exclusive: for the consumer's lifetime; "
                                         "one-in-flight: one message at a time"),
        filter: Optional[str] = typer.Option(None, "--filter", "-f", help="which messages of the topics enter"),
        lvq_key: Optional[str] = typer.Option(None, "--lvq-key", help="last-value queue key (header or /body/path)"),
        priority: Optional[str] = typer.Option(None, "--priority", metavar="EXPR",
                                               help="priority expression, e.g. '/price * /qty'"),
        sort_key: Optional[str] = typer.Option(None, "--sort-key", help="deliver in ascending order of this key"),
        barrier: Optional[str] = typer.Option(None, "--barrier", help="messages matching this expression wait until "
                                              "every earlier message is acknowledged, and hold back later ones"),
        browse_only: bool = typer.Option(False, "--browse-only", help="every subscriber sees every message; acks "
                                         "remove nothing"),
        target_queue_depth: int = typer.Option(0, "--target-queue-depth", help="messages kept in memory (0: all)"),
        max_depth: int = typer.Option(0, "--max-depth", help="messages held at most (0: no limit)"),
        max_bytes: Optional[str] = typer.Option(None, "--max-bytes", help="payload bytes held at most, e.g. 512MiB"),
        overflow: str = typer.Option("reject", "--overflow", help="reject | ring | flow-control: at --max-depth "
                                     "or --max-bytes, refuse publishes, drop the oldest, or hold confirmations"),
        backoff: Optional[str] = typer.Option(None, "--backoff", help="retry schedule, comma-separated: a cancelled "
                                              "or expired delivery waits each step in turn, e.g. 1s,10s,1m (the last "
                                              "repeats; default 1s,5s,30s,1m,5m; none: at once)"),
        backoff_jitter: Optional[float] = typer.Option(None, "--backoff-jitter", help="spread each wait by up to "
                                                       "this fraction either way (0..1, default 0.1)"),
        max_lease_age: Optional[str] = typer.Option(None, "--max-lease-age", help="a connected consumer's leases "
                                                    "renew by themselves until a delivery is this old, e.g. 10m"),
        max_failures: int = typer.Option(0, "--max-failures", help="cancels naming an error before a message is "
                                         "dead-lettered (0: no limit)"),
        max_lease_expiries: int = typer.Option(0, "--max-lease-expiries", help="lease expiries before a message is "
                                               "dead-lettered (0: no limit)"),
        max_consumer_gone: int = typer.Option(0, "--max-consumer-gone", help="deliveries whose consumer went away "
                                              "before a message is dead-lettered (0: no limit)"),
        tenant_header: Optional[str] = typer.Option(None, "--tenant-header", help="the header naming a message's "
                                                    "tenant: tenants share the queue by weight"),
        tenant_weight: list[str] = typer.Option([], "--tenant-weight", metavar="TENANT=WEIGHT",
                                                help="a tenant's weight (1..1000; repeat the option per tenant)"),
        tenant_default_weight: Optional[int] = typer.Option(None, "--tenant-default-weight",
                                                            help="the weight of every other tenant (default 1)"),
        priority_aging: Optional[int] = typer.Option(None, "--priority-aging", help="with --priority: one priority "
                                                     "level is worth this many messages of waiting (0: strict)"),
        as_json: bool = typer.Option(False, "--json", help="print every setting of the new queue as JSON"),
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Create a queue now; it survives restarts. Creating it again with the same
        settings succeeds; with others it is refused, naming each difference."""
        if dead_letter is not None and no_dead_letter:
            raise fail("--dead-letter and --no-dead-letter contradict each other", RET_USAGE)
        settings = {
            "topics": topics, "semantics": semantics, "fairness": fairness, "lease": lease,
            "max_per_subscription_backlog": max_backlog, "max_cancels": max_cancels,
            "max_deliveries": max_deliveries, "expiration": expiration, "dead_letter": dead_letter,
            "group_header": group_header, "group_policy": group_policy, "filter": filter,
            "lvq_key": lvq_key, "priority": priority, "sort_key": sort_key, "barrier": barrier,
            "browse_only": browse_only or None,
            "target_queue_depth": target_queue_depth or None, "max_depth": max_depth or None, "max_bytes": max_bytes, "overflow": overflow,
            "backoff": backoff_steps(backoff),
            "backoff_jitter": backoff_jitter, "max_lease_age": max_lease_age,
            "max_failures": max_failures or None, "max_lease_expiries": max_lease_expiries or None,
            "max_consumer_gone": max_consumer_gone or None,
            "tenant_header": tenant_header, "tenant_weights": parse_weights(tenant_weight) or None,
            "tenant_default_weight": tenant_default_weight, "priority_aging": priority_aging,
        }
        if no_dead_letter:
            settings["dead_letter"] = ""
        with client_for(endpoint) as c:
            existed = any(q["name"] == name for q in run(c.queues))
            created = run(lambda: c.create_queue(name, **{k: v for k, v in settings.items() if v is not None}))
        if as_json:
            typer.echo(json.dumps(created))
            return
        from zq.cli.views import queue_summary

        typer.echo(f"{'queue ' + repr(name) + ' exists, as asked' if existed else 'created queue ' + repr(name)}: "
                   f"{queue_summary(created)}")


def register_queue_alter(queue_app: typer.Typer) -> None:
    @queue_app.command("alter")
    def queue_alter(
        name: str = typer.Argument(..., help="a queue created at run time (zq.toml's change in zq.toml)"),
        lease: Optional[str] = typer.Option(None, "--lease", help="lease of deliveries from now on, e.g. 2m"),
        max_backlog: Optional[int] = typer.Option(None, "--max-backlog", help="unacknowledged messages one new "
                                                  "subscription may hold"),
        max_cancels: Optional[int] = typer.Option(None, "--max-cancels", help="cancels before a dead letter (0: none)"),
        max_deliveries: Optional[int] = typer.Option(None, "--max-deliveries", help="deliveries before a dead letter "
                                                     "(0: no limit)"),
        expiration: Optional[str] = typer.Option(None, "--expiration", help="dead-letter messages older than this "
                                                 "(never: no expiration)"),
        dead_letter: Optional[str] = typer.Option(None, "--dead-letter", help="topic that receives dead letters"),
        no_dead_letter: bool = typer.Option(False, "--no-dead-letter", help="drop dead letters from now on"),
        fairness: Optional[str] = typer.Option(None, "--fairness", help="fast | round-robin | proportional"),
        max_depth: Optional[int] = typer.Option(None, "--max-depth", help="messages held at most (0: no limit)"),
        max_bytes: Optional[str] = typer.Option(None, "--max-bytes", help="payload bytes held at most (a queue "
                                                "created with a byte limit)"),
        overflow: Optional[str] = typer.Option(None, "--overflow", help="reject | ring | flow-control"),
        resume_percent: Optional[int] = typer.Option(None, "--resume-percent", help="flow-control: confirmations "
                                                     "flow again below this % of the limits"),
        backoff: Optional[str] = typer.Option(None, "--backoff", help="retry schedule, e.g. 1s,10s,1m (none: at once; "
                                              "default: 1s,5s,30s,1m,5m)"),
        backoff_jitter: Optional[float] = typer.Option(None, "--backoff-jitter", help="0..1"),
        max_lease_age: Optional[str] = typer.Option(None, "--max-lease-age", help="leases of connected consumers "
                                                    "renew until this age (off: never)"),
        max_failures: Optional[int] = typer.Option(None, "--max-failures", help="failures before a dead letter"),
        max_lease_expiries: Optional[int] = typer.Option(None, "--max-lease-expiries", help="lease expiries before "
                                                         "a dead letter"),
        max_consumer_gone: Optional[int] = typer.Option(None, "--max-consumer-gone", help="consumers gone before a "
                                                        "dead letter"),
        tenant_weight: list[str] = typer.Option([], "--tenant-weight", metavar="TENANT=WEIGHT",
                                                help="the queue's tenant weights, all of them (repeat per tenant)"),
        tenant_default_weight: Optional[int] = typer.Option(None, "--tenant-default-weight", help="every other "
                                                            "tenant's weight"),
        as_json: bool = typer.Option(False, "--json", help="print what changed and every setting as JSON"),
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Change settings of a live queue, keeping its messages (journaled: a restart
        keeps them). What decides which messages it holds or their order (topics,
        filter, kind, groups, priority, semantics) cannot change: that is refused, saying so."""
        if dead_letter is not None and no_dead_letter:
            raise fail("--dead-letter and --no-dead-letter contradict each other", RET_USAGE)
        changes: dict[str, object] = {
            "lease": lease, "max_per_subscription_backlog": max_backlog, "max_cancels": max_cancels,
            "max_deliveries": max_deliveries, "dead_letter": "" if no_dead_letter else dead_letter,
            "fairness": fairness, "max_depth": max_depth, "max_bytes": max_bytes, "overflow": overflow,
            "resume_percent": resume_percent, "backoff": backoff_steps(backoff), "backoff_jitter": backoff_jitter,
            "max_failures": max_failures, "max_lease_expiries": max_lease_expiries,
            "max_consumer_gone": max_consumer_gone, "tenant_weights": parse_weights(tenant_weight) or None,
            "tenant_default_weight": tenant_default_weight,
        }
        given = {k: v for k, v in changes.items() if v is not None}
        for key, value, off in (("expiration", expiration, "never"), ("max_lease_age", max_lease_age, "off")):
            if value is not None:
                given[key] = None if value.strip().lower() == off else value  # null: the default (none)
        if not given:
            raise fail("name at least one setting to change (zq queue alter --help lists them)", RET_USAGE)
        with client_for(endpoint) as c:
            result = run(lambda: c.alter_queue(name, **given))
        if as_json:
            typer.echo(json.dumps(result))
            return
        if not result["changed"]:
            typer.echo(f"queue {name!r} unchanged: it had those settings")
            return
        typer.echo(f"altered queue {name!r}: " + "; ".join(result["changed"]))


def register_queue_delete(queue_app: typer.Typer) -> None:
    @queue_app.command("delete")
    def queue_delete(
        name: str = typer.Argument(..., help="a queue created at run time (zq.toml's queues stay)"),
        yes: bool = YesOpt,
        endpoint: Optional[str] = EndpointOpt,
    ) -> None:
        """Delete a run-time queue and every message it holds."""
        with client_for(endpoint) as c:
            held = next((q for q in run(c.queues) if q["name"] == name), None)
            if held is None:  # said before asking to confirm
                raise fail(f"no queue named {name[:200]!r} (`zq queue list` shows them)", RET_USAGE)
            confirm_or_stop(f"delete queue {name!r} and its messages", yes)
            typer.echo(f"deleted {name} ({run(lambda: c.delete_queue(name))} messages)")


def backoff_steps(text: str | None) -> list[str] | None:
    """``--backoff 1s,10s,1m`` as steps; ``none``: no waiting (None: the default schedule)."""
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    return [step.strip() for step in text.split(",")]


def parse_weights(items: list[str]) -> dict[str, int]:
    """``--tenant-weight gold=4`` options as a table; the server checks the values."""
    weights: dict[str, int] = {}
    for item in items:
        tenant, sep, weight = item.rpartition("=")
        if not sep or not weight.strip().lstrip("-").isdigit():
            raise typer.BadParameter(f"--tenant-weight takes TENANT=WEIGHT, e.g. gold=4; got {item[:80]!r}")
        if not 1 <= int(weight) <= limits.TENANT_WEIGHT_MAX:
            raise typer.BadParameter(f"--tenant-weight {tenant[:80]!r}: a weight is a whole number "
                                     f"1..{limits.TENANT_WEIGHT_MAX}, got {weight[:40]}")
        weights[tenant] = int(weight)
    return weights
