"""Pure: TopModel -> rich renderables. Tested against recorded text."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from zq.top.model import TopModel

BARS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[int], width: int = 20) -> str:
    values = values[-width:]
    if not values:
        return ""
    top = max(values) or 1
    return "".join(BARS[min(len(BARS) - 1, round(v * (len(BARS) - 1) / top))] for v in values)


def bar(used: int, limit: int, width: int = 10) -> str:
    filled = round(width * used / limit) if limit else 0
    return "█" * filled + "·" * (width - filled)


def human_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms == float("inf"):
        return ">60s"
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 60_000:.0f}m"


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return ""  # pragma: no cover


def header(m: TopModel) -> Panel:
    r = m.rates
    state = Text("connected", style="green") if m.connected else Text(f"disconnected, retrying ({m.note})", style="bold red")
    line1 = Text.assemble(("zq top ", "bold"), f"{m.endpoint}  {m.version}  up {human_ms(m.uptime_ms)}  ", state)
    line2 = Text(
        f"durability {m.durability}   journal {human_bytes(m.journal_bytes)} of map {human_bytes(m.journal_map_bytes)}   "
        f"publish {r.get('publish', 0):,.0f}/s  deliver {r.get('deliver', 0):,.0f}/s  ack {r.get('ack', 0):,.0f}/s   "
        f"publishers {m.publishers}  workers {m.workers}"
    )
    lines = [line1, line2]
    c = m.cluster
    if c:
        isr = ", ".join(str(n)[:24] for n in c.get("isr", [])[:8])
        lines.append(Text(f"cluster: {c.get('role')} {str(c.get('node'))[:24]}  epoch {c.get('epoch')}   in sync: {isr}"
                          + ("" if c.get("serving", True) else "   NOT SERVING (fenced)"),
                          style=None if c.get("serving", True) else "bold red"))
    if m.standbys or m.replicas_ack:
        copies = ", ".join(f"{(s.get('node') or s['name'])[:24]} lag {s['lag_records']:,}"
                           + (f" / {human_ms(s['lag_ms'])}" if s.get("lag_ms") is not None else "")
                           + ("" if s.get("in_sync") in (None, True) else " (out of sync)")
                           for s in m.standbys[:4]) or "none connected"
        lines.append(Text(f"standbys: {copies}" + (f"   confirmations wait for {m.replicas_ack}" if m.replicas_ack else ""),
                          style=None if len(m.standbys) >= m.replicas_ack else "bold red"))
    return Panel(Group(*lines), padding=(0, 1))


def queues_table(m: TopModel) -> Table:
    t = Table(title=f"queues (sorted by {m.sort}; keys: d depth, r rate, l latency, n name, q quit)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("queue", "depth", "delay", "leased", "in/s", "out/s", "oldest", "redel", "lost", "exp", "dead", "cons",
                "p50", "p99", "1 min"):
        t.add_column(col, justify="left" if col in ("queue", "1 min") else "right", no_wrap=True)
    for q in m.queues:
        t.add_row(q.name, f"{q.depth:,}", f"{q.delayed:,}", f"{q.leased:,}", f"{q.in_rate:,.0f}", f"{q.out_rate:,.0f}", human_ms(q.oldest_ms),
                  f"{q.redelivered:,}", f"{q.lost:,}", f"{q.expired:,}", f"{q.dead_lettered:,}", str(q.consumers),
                  human_ms(q.p50_ms), human_ms(q.p99_ms), sparkline(q.depth_history, 12))
    return t


def consumers_table(m: TopModel) -> Table:
    t = Table(title="consumers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col, just in (("worker", "left"), ("queue", "left"), ("backlog", "left"), ("acks/s", "right"),
                      ("mean processing", "right"), ("last heard", "right"), ("given back", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for c in m.consumers:
        t.add_row(c.name, c.queue, f"{bar(c.used, c.backlog)} {c.used}/{c.backlog}", f"{c.ack_rate:,.0f}",
                  human_ms(c.mean_ms), human_ms(c.heard_ms_ago) + " ago" if c.heard_ms_ago is not None else "-",
                  f"{c.given_back:,}" if c.given_back is not None else "-")
    return t


def holder_label(busiest: dict) -> str:
    """A group's holder: the name it gave at HELLO (short), else its consumer id's start."""
    return (busiest.get("holder") or busiest["owner"])[:12] if busiest.get("holder") != busiest["owner"] \
        else busiest["owner"][:8]


def groups_table(m: TopModel) -> Table:
    t = Table(title="groups", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("queue", "groups", "in flight"):
        t.add_column(col, no_wrap=True)
    t.add_column("busiest (pending, holder)")  # the long one wraps: the counts keep their width
    for g in m.groups:
        busiest = ", ".join(f"{b['group']} ({b['pending']}{', ' + holder_label(b) if b['owner'] else ''})" for b in g.busiest)
        t.add_row(g.queue, f"{g.groups:,}", f"{g.in_flight:,}", busiest or "-")
    return t


def tenants_table(m: TopModel) -> Table:
    t = Table(title="tenants (fair share)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("queue", no_wrap=True)
    t.add_column("holding most (messages, weight)")  # wraps: there may be ten
    for row in m.tenants:
        t.add_row(row.queue, ", ".join(f"{x['tenant'][:24] or '(none)'} ({x['held']:,}, w{x['weight']})"
                                       for x in row.tenants))
    return t


def render(m: TopModel) -> Group:
    parts = [header(m), queues_table(m)]
    if m.oldest_why:
        parts.append(Text(m.oldest_why + "\n", overflow="fold"))
    parts.append(consumers_table(m))
    if m.groups:
        parts.append(groups_table(m))
    if m.tenants:
        parts.append(tenants_table(m))
    return Group(*parts)
