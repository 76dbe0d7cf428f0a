"""The ``zq`` command. Each command parses options and calls one library function."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Optional

import msgspec
import typer

from zq.cli import access as cli_access
from zq.cli.journal import journal_app
from zq.server.config import Config, duration_ms
from zq.core.errors import ConfigError, ZqError

from zq.cli.consume_exec import parse_grace, run_exec
from zq.cli.common import RET_CONNECT, RET_ERROR, RET_OK, RET_USAGE, EndpointOpt, client_for, endpoint_of, fail, message_json  # noqa: F401

app = typer.Typer(
    name="zq",
    help="zq: a journaled ZeroMQ work-queue dispatcher. Start with `zq demo`, then `zq serve`.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # help texts mean their brackets: "[security]", not rich markup
    context_settings={"help_option_names": ["-h", "--help"]},
)


def show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from zq.build import describe

        try:
            typer.echo(f"zq {version('zq')} ({describe()})")
        except PackageNotFoundError:  # run from a tree that is not installed
            typer.echo(f"zq (not installed; {describe()})")
        raise typer.Exit(RET_OK)


@app.callback()
def keys(
    key: Optional[str] = typer.Option(None, "--key", help="your secret key file (NAME.key_secret) for a dispatcher "
                                      "with a security block (env ZQ_KEY)"),
    server_key: Optional[str] = typer.Option(None, "--server-key", help="the dispatcher's public key file (or z85 "
                                             "key) (env ZQ_SERVER_KEY)"),
    version: bool = typer.Option(False, "--version", "-V", help="print zq's version and exit", is_eager=True,
                                 callback=show_version),
) -> None:
    """CurveZMQ keys for every client command (they read ZQ_KEY / ZQ_SERVER_KEY)."""
    if key:
        os.environ["ZQ_KEY"] = key
    if server_key:
        os.environ["ZQ_SERVER_KEY"] = server_key


@app.command()
def keygen(
    name: str = typer.Argument(..., help="the key's name: writes NAME.key (public) and NAME.key_secret"),
    directory: str = typer.Option(".", "--dir", help="where to write them"),
) -> None:
    """Write a CurveZMQ key pair in ZeroMQ's certificate format.

    Give the server its NAME.key_secret ([security] secret_key) and each client its own;
    put the clients' NAME.key files in the server's allowlist directory ([security] allow)."""
    from zq.keys import keygen as make_keys

    try:
        public, secret = make_keys(directory, name)
    except (ValueError, OSError) as exc:
        raise fail(str(exc), RET_USAGE) from None
    typer.echo(f"public key: {public}\nsecret key: {secret} (keep it private)")


def load_config(config: str | None, data: str | None, bind: list[str] | None, durability: str | None) -> Config:
    try:
        cfg = Config.load(config) if config else Config()
    except ZqError as exc:
        raise fail(str(exc), RET_USAGE) from None
    changes: dict = {}
    if data:
        changes["data"] = data
    if bind:
        changes["bind"] = list(bind)
    if durability:
        if durability not in ("fsync", "batch", "none"):
            raise fail(f"--durability must be fsync, batch or none, got {durability!r}", RET_USAGE)
        changes["durability"] = durability
    return msgspec.structs.replace(cfg, **changes) if changes else cfg


@app.command()
def serve(
    config: Optional[str] = typer.Option(None, "--config", "-c", help="zq.toml; without it, the embedded default"),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="journal directory (default ./zq-data)"),
    bind: Optional[list[str]] = typer.Option(None, "--bind", help="endpoint to bind (repeatable) (default tcp://127.0.0.1:7780)"),
    durability: Optional[str] = typer.Option(None, "--durability", help="fsync | batch | none (default batch)"),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="serve Prometheus metrics on HOST:PORT (/metrics)"),
    node: Optional[str] = typer.Option(None, "--node", help="this node's name in the [cluster] (overrides cluster.node)"),
) -> None:
    """Run the dispatcher until SIGTERM or Ctrl-C (then commit everything and stop).

    With a [cluster] block naming ZooKeeper, run one node of an elected cluster: it
    leads when ZooKeeper elects it and is a standby of the leader until then.

    A data directory that held a journal is never started empty: a journal file that is
    missing, empty, truncated or shorter than the directory's mark (journal.id), or
    holds damaged records, is refused with one line naming the damage. `zq journal
    repair DIR` keeps everything sound; `zq journal reset DIR` starts anew on purpose."""
    from zq.server import Server
    from zq.server.memory import return_big_blocks

    log_with_time()
    cfg = load_config(config, data, bind, durability)
    if metrics:
        cfg = msgspec.structs.replace(cfg, metrics=metrics)
    if node is not None or bind or cfg.cluster_section.zookeeper:
        from zq.server.config import cluster_config

        try:
            cfg.cluster = cluster_config(cfg.cluster_section, cfg.bind, node)
        except ZqError as exc:
            raise fail(f"{config or 'config'}: {exc}", RET_USAGE) from None
    return_big_blocks()  # (zq.server.memory)
    if cfg.cluster is not None:
        serve_node(cfg)
        return
    try:
        server = Server(cfg)
    except ZqError as exc:
        raise fail(str(exc)) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    signal.signal(signal.SIGHUP, lambda *_: server.request_reload())
    if config is not None and cfg.security is not None:  # SIGHUP reads the entitlements again too
        config_path = config
        server.rules_source = lambda: Config.load(config_path).security  # (a bad file: ConfigError, logged)
    queues = ", ".join(server.engine.queues) or "none yet (auto-created on first use)"
    from zq.build import describe

    typer.echo(f"zq serving on {' '.join(server.endpoints)}; data {cfg.data} ({cfg.durability}); queues: {queues}; "
               f"{describe()}; {serving_notes(cfg)}", err=True)
    if cfg.replicas_ack:
        who = (f"every in-sync standby (at least {cfg.replicas_ack})" if cfg.cluster is not None
               else f"{cfg.replicas_ack} standby(s) (`zq standby`)")
        typer.echo(f"zq: replicas_ack = {cfg.replicas_ack}: every publish is confirmed only once {who} "
                   "have it on disk; until then, publishers wait", err=True)
    if server.metrics is not None:
        typer.echo(f"metrics on http://{cfg.metrics.rpartition(':')[0] or '127.0.0.1'}:{server.metrics.port}/metrics", err=True)
    server.run()
    typer.echo("zq stopped cleanly", err=True)


def serving_notes(cfg) -> str:  # type: ignore[no-untyped-def]
    """What an operator should know at start about who may connect."""
    if cfg.security is not None:
        return "security on (CurveZMQ, allowlisted keys only)"
    return "security off (plaintext, anyone who reaches the endpoint)"


def log_with_time() -> None:
    """The dispatcher's warnings on stderr, each with its time (what an operator lines
    up against clients' logs after a failover)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s.%(msecs)03d %(name)s: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")


def serve_node(cfg) -> None:  # type: ignore[no-untyped-def]
    """``zq serve`` as one node of an elected cluster (zq.server.cluster)."""
    from zq.build import describe
    from zq.server.cluster import Node

    try:
        node = Node(cfg)
    except ImportError as exc:
        raise fail(str(exc)) from None  # (names `pip install 'zq[cluster]'`)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stop())
    cc = cfg.cluster
    typer.echo(f"zq node {cc.node} of {cc.zookeeper}{cc.path}: on {' '.join(cfg.bind)} (advertised {cc.advertise}); "
               f"data {cfg.data}; replicas_ack {cfg.replicas_ack}; {describe()}", err=True)
    try:
        node.run()
    except ZqError as exc:
        raise fail(f"zq node {cc.node}: {exc}") from None
    typer.echo(f"zq node {cc.node} stopped cleanly (led {node.terms} time(s))", err=True)


@app.command()
def standby(
    leader: str = typer.Argument(..., help="the dispatcher to copy, e.g. tcp://10.0.0.5:7780"),
    data: str = typer.Option(..., "--data", "-d", help="this standby's journal directory"),
    batch: int = typer.Option(65_536, "--batch", help="records asked for per request (1..65,536)"),
    status_every: float = typer.Option(10.0, "--status-every", help="seconds between status lines on stderr"),
    bind: Optional[list[str]] = typer.Option(None, "--bind", help="answer clients here that the leader is "
                                             "LEADER (the endpoint this node serves on once promoted)"),
) -> None:
    """Keep a copy of a dispatcher's journal, pulled as it grows, until SIGTERM or Ctrl-C.

    Promote it by hand: stop it, then `zq serve --data DIR` on its directory. CurveZMQ
    keys come from $ZQ_KEY / $ZQ_SERVER_KEY, as for any client; the leader's [cluster]
    standby_secret from $ZQ_STANDBY_SECRET (its replicas_ack counts this copy only then)."""
    import time as time_mod

    from zq.keys import client_curve
    from zq.server.standby import NotLeader, Standby
    from zq.server.trust import STANDBY_SECRET_ENV

    from zq.client.session import check_endpoint

    if not 1 <= batch <= 65_536:
        raise fail("--batch must be 1..65,536", RET_USAGE)
    try:
        check_endpoint(leader)
    except ValueError as exc:
        raise fail(str(exc), RET_USAGE) from None
    try:
        follower = Standby(endpoint_of(leader), data, curve=client_curve(), batch=batch,
                           proof=os.environ.get(STANDBY_SECRET_ENV, ""))
        responder = NotLeader(bind, leader) if bind else None
    except ZqError as exc:
        raise fail(str(exc)) from None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: follower.stop())
    typer.echo(f"zq standby of {leader}: journal {data}, from bookmark {follower.state.position}", err=True)

    def report() -> None:
        while not follower.stopping.wait(status_every):
            st = follower.state
            typer.echo(f"zq standby: at {st.position} of {st.leader_next} (lag {st.lag_records} records), "
                       f"{st.records} copied{'; ' + st.error if st.error else ''}", err=True)

    threading.Thread(target=report, daemon=True).start()
    started = time_mod.monotonic()
    try:
        follower.run()
    except ZqError as exc:
        raise fail(f"zq standby: {exc}") from None
    finally:
        if responder is not None:
            responder.close()
    typer.echo(f"zq standby stopped at {follower.state.position} ({follower.state.records} records copied in "
               f"{time_mod.monotonic() - started:.1f}s)", err=True)


def parse_headers(header: list[str] | None) -> dict[str, str]:
    out = {}
    for h in header or []:
        k, sep, v = h.partition("=")
        if not sep or not k:
            raise fail(f"--header wants KEY=VALUE, got {h!r}", RET_USAGE)
        out[k] = v
    return out


def seconds_option(text: str | None, option: str, allow_zero: bool) -> float | None:
    """A duration option (``30s``, ``5m``) in seconds; a bad one is a usage error naming it."""
    if text is None:
        return None
    try:
        ms = duration_ms(text, option)
    except ConfigError as exc:
        raise fail(str(exc), RET_USAGE) from None
    if ms < 0 or not allow_zero and ms == 0:
        raise fail(f"{option} must be {'0 or more' if allow_zero else 'more than 0'}", RET_USAGE)
    return ms / 1000


@app.command()
def publish(
    topic: str = typer.Argument(..., help="topic (or a queue name) to publish to"),
    data: Optional[str] = typer.Argument(None, help="the payload; without it, one message per stdin line"),
    endpoint: Optional[str] = EndpointOpt,
    group: Optional[str] = typer.Option(None, "--group", "-g", help="message group (sets header 'group')"),
    priority: Optional[int] = typer.Option(None, "--priority", "-p", help="priority (sets header 'priority')"),
    msg_id: Optional[str] = typer.Option(None, "--id", help="client message id"),
    header: Optional[list[str]] = typer.Option(None, "--header", "-H", help="KEY=VALUE (repeatable)"),
    delay: Optional[str] = typer.Option(None, "--delay", help="deliver no sooner than this from now, e.g. 30s, 5m"),
    ttl: Optional[str] = typer.Option(None, "--ttl", help="a message still waiting this long from now expires (reason "
                                      "ttl) and is dead-lettered, e.g. 10m"),
) -> None:
    """Publish messages; prints each bookmark once the message is durable."""
    headers = parse_headers(header)
    delay_s = seconds_option(delay, "--delay", allow_zero=True)
    ttl_s = seconds_option(ttl, "--ttl", allow_zero=False)
    with client_for(endpoint) as c:
        # A publish held for a second or more: say what it waits for (once per reason).
        c.on_notice = lambda n: typer.echo(f"zq publish: not confirmed yet: {n.message}", err=True)
        known = {q["name"] for q in c.queues()}
        try:
            if data is not None:
                typer.echo(c.publish(topic, data, group=group, priority=priority, msg_id=msg_id, headers=headers,
                                     delay=delay_s, ttl=ttl_s))
            else:
                futures = [
                    c.publish_async(topic, line.rstrip("\n"), group=group, priority=priority, headers=headers,
                                    delay=delay_s, ttl=ttl_s)
                    for line in sys.stdin
                ]
                for f in futures:
                    typer.echo(f.result(60))
        except ZqError as exc:
            raise fail(str(exc)) from None
        except TimeoutError:  # (the notice above said what it waits for)
            raise fail("not confirmed in time: the message may or may not be stored (publish it again with --id to "
                       "be sure it is stored once)") from None
        if topic not in known and any(q["name"] == topic for q in c.queues()):  # a typo makes a queue: say so
            typer.echo(f"zq publish: no queue covered {topic!r}: created queue {topic!r}, which keeps these "
                       f"messages until they are consumed (`zq queue list` shows every queue)", err=True)


@app.command()
def consume(
    queue: str = typer.Argument(..., help="queue to consume"),
    endpoint: Optional[str] = EndpointOpt,
    filter: Optional[str] = typer.Option(None, "--filter", "-f", help="content filter, e.g. \"region = 'eu' AND /qty > 5\""),
    max_backlog: Optional[int] = typer.Option(None, "--max-backlog", "-b", help="unacked messages at once (default: concurrency)"),
    count: Optional[int] = typer.Option(None, "--limit", "--count", "-n", help="stop after N messages"),
    timeout: Optional[float] = typer.Option(None, "--timeout", "-t", help="stop after S seconds without a message"),
    exec_: Optional[str] = typer.Option(None, "--exec", "-x", help="run COMMAND per message (payload on stdin); exit 0 acks, "
                                        "else cancels as failed; exit 126/127 (cannot run): the message goes back, "
                                        "zq stops and exits with that status"),
    concurrency: int = typer.Option(1, "--concurrency", "-j", help="commands run at once with --exec"),
    grace: str = typer.Option("30", "--grace", metavar="SECONDS", help="with --exec: on SIGTERM / Ctrl-C, seconds "
                              "the running commands get to finish (0..86400); a second signal cancels them"),
    reclaimable: bool = typer.Option(False, "--reclaimable", help="let the dispatcher take back prefetched messages "
                                     "not yet started, for an idle consumer"),
    publish_to: Optional[str] = typer.Option(None, "--publish-to", metavar="TOPIC", help="with --exec: publish each "
                                             "line the command writes to stdout to TOPIC, in the same commit as the "
                                             "message's ack (both or neither; at most 4,096 lines and 16 MiB, else "
                                             "the message fails)"),
) -> None:
    """Print messages as JSON lines and ack each; or run --exec per message.

    With --exec, SIGTERM or Ctrl-C stops taking messages and lets the running commands
    finish for up to --grace seconds, each acked or cancelled by its exit status; a
    second signal (or the end of the grace period) cancels them and their messages go
    back to the queue, not counted as failed. Each command runs in its own process
    group: a Ctrl-C reaches zq only, and a cancel reaches all the command started."""
    if concurrency < 1:
        raise fail("--concurrency must be at least 1", RET_USAGE)
    if publish_to is not None and not exec_:
        raise fail("--publish-to publishes what an --exec command writes: give --exec too", RET_USAGE)
    if publish_to is not None and not publish_to.strip():
        raise fail("--publish-to needs a topic", RET_USAGE)
    grace_s = parse_grace(grace)
    with client_for(endpoint) as c:
        known = {q["name"]: q for q in c.queues()}
        try:
            sub = c.subscribe(queue, max_backlog=max_backlog or concurrency, filter=filter, reclaimable=reclaimable)
        except ZqError as exc:
            raise fail(str(exc), RET_USAGE) from None
        if queue not in known:  # a typo waits in silence otherwise: say so
            typer.echo(f"zq consume: no queue {queue!r} yet: waiting for messages on topic {queue!r} (Ctrl-C to stop; "
                       "the queue stays only once something is published to it)", err=True)
        settings = known.get(queue) or next((q for q in c.queues() if q["name"] == queue), {})
        with sub:
            if exec_:
                code = run_exec(sub, exec_, concurrency, count, timeout, settings, grace_s, publish_to)
                if code:
                    raise typer.Exit(code)
            else:
                print_messages(sub, count, timeout)


def print_messages(sub, count: int | None, timeout: float | None) -> None:  # type: ignore[no-untyped-def]
    seen = 0
    while count is None or seen < count:
        msg = sub.get(timeout)
        if msg is None:
            break
        sys.stdout.write(message_json(msg) + "\n")
        sys.stdout.flush()
        msg.ack()
        seen += 1


@app.command()
def stats(
    queue: Optional[str] = typer.Argument(None, help="only this queue (default: every queue, or the 1,000 holding the most when there are more)"),
    endpoint: Optional[str] = EndpointOpt,
    as_json: bool = typer.Option(False, "--json", help="print the raw stats as JSON (with QUEUE: that queue's)"),
) -> None:
    """Per queue: depth, leased, published, acked, dead-lettered, consumers."""
    asked = None if queue is None else [queue] if utf8(queue) else []  # (not UTF-8: no queue has that name)
    with client_for(endpoint) as c:
        st = c.stats(queues=asked)
    if queue is None and st.get("server", {}).get("queues_listed", 0) < st.get("server", {}).get("queues", 0):
        s = st["server"]
        typer.echo(f"{s['queues_listed']:,} of {s['queues']:,} queues listed (those holding the most messages; "
                   "`zq stats QUEUE` shows any one)", err=True)
    if queue is not None:
        one = st.get("queues", {}).get(queue)
        if one is None:  # as every command that names a queue says it (exit 2)
            raise fail(f"no queue named {shown_name(queue)} (`zq queue list` shows every queue)", RET_USAGE)
        if as_json:
            typer.echo(json.dumps(one, indent=2, default=str))
            return
        st = {**st, "queues": {queue: one}}
    elif as_json:
        typer.echo(json.dumps(st, indent=2, default=str))
        return
    from zq.cli.views import print_table, replication_lines, stats_rows

    print_table(*stats_rows(st))
    if queue is None:  # the dispatcher's own lines: under the whole table only
        for line in replication_lines(st):
            typer.echo(line)


def utf8(text: str) -> bool:
    """Can ``text`` be sent (an argument that was not UTF-8 holds surrogates)?"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_name(name: str, limit: int = 80) -> str:
    """A name a user typed, quoted for one line of an error: control characters escaped,
    a long one cut (saying how long it was)."""
    if len(name) <= limit:
        return repr(name)
    return f"{name[:limit]!r}... ({len(name):,} characters)"


@app.command()
def peek(
    queue: str = typer.Argument(..., help="queue to look into (read-only)"),
    endpoint: Optional[str] = EndpointOpt,
    limit: int = typer.Option(20, "--limit", "-n", help="at most this many messages"),
    filter: Optional[str] = typer.Option(None, "--filter", "-f", help="only messages matching this expression"),
) -> None:
    """List waiting messages in delivery order without leasing them (JSON lines).

    A message waiting for its retry or its publish's delay has `not_before_ms` (Unix ms)
    and `due`, the same for a person: local time and how long from now."""
    import time as time_mod
    from types import SimpleNamespace

    from zq.cli.views import due_text

    with client_for(endpoint) as c:
        try:
            items = c.peek(queue, limit, filter)
        except ZqError as exc:
            raise fail(str(exc), RET_USAGE) from None
    now_ms = int(time_mod.time() * 1000)
    for it in items:
        msg = SimpleNamespace(group=it.get("group"), data=it["data"], **{k: it[k] for k in ("bookmark", "topic", "headers", "deliveries")})
        line = message_json(msg, not_before_ms=it.get("not_before_ms"))
        if it.get("not_before_ms") is not None:
            doc: dict = {}
            for key, value in json.loads(line).items():  # "due" right after the raw field, which stays as it was
                doc[key] = value
                if key == "not_before_ms":
                    doc["due"] = due_text(value, now_ms)
            line = json.dumps(doc, ensure_ascii=False)
        typer.echo(line)


@app.command()
def top(
    endpoint: Optional[str] = EndpointOpt,
    interval: float = typer.Option(1.0, "--interval", "-i", help="seconds between refreshes"),
    once: bool = typer.Option(False, "--once", help="print one frame as plain text and exit"),
) -> None:
    """Live monitor: rates, depth, latency, consumers, groups (keys: d r l n sort, q quit)."""
    from zq.top import app as top_app

    ep = endpoint_of(endpoint)
    if once:
        try:
            typer.echo(top_app.once(ep, interval), nl=False)
        except Exception as exc:
            raise fail(f"cannot reach a zq dispatcher at {ep}: {exc}", RET_CONNECT) from None
        return
    top_app.live(ep, interval)


@app.command()
def demo(
    messages: int = typer.Option(20_000, "--messages", help="how many messages to publish"),
    workers: int = typer.Option(4, "--workers", help="worker processes"),
    backlog: int = typer.Option(16, "--backlog", help="max backlog per worker"),
    fail_rate: float = typer.Option(0.01, "--fail-rate", help="share of messages a worker cancels (to show redelivery)"),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="journal directory (default: a temporary one)"),
) -> None:
    """A whole fleet in one command: an embedded dispatcher, a publisher, workers, a summary."""
    from zq.cli.demo import run_demo

    raise typer.Exit(run_demo(messages=messages, workers=workers, backlog=backlog, fail_rate=fail_rate, data=data))


def command():  # type: ignore[no-untyped-def]
    """The ``zq`` command as click runs it, every parameter labelled in plain words."""
    import typer.main

    from zq.cli.help import plain_words

    return plain_words(typer.main.get_command(app))


def main() -> None:
    command()(prog_name="zq")


cli_access.register(app)
cli_access.register_management(app)
app.add_typer(journal_app, name="journal")
