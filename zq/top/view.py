"""Pure: TopModel -> rich renderables, laid out for the terminal. Tested against recorded text.

The frame fits the terminal it is drawn on (``Frame`` reads the width and height at render
time). Width: each table shows the columns that fit, dropping the least important first
(``Col.rank``) and writing numbers compactly (12.3k) before that; a header or a number is
never cut to "…". Height: when the whole frame does not fit, the sections share the rows
(``allocate``): the busy queues first, then a line for the rest ("+ 9 idle queues"), and the
consumers keep rows of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from zq.top.model import ConsumerRow, QueueRow, TopModel, is_idle

BARS = " ▁▂▃▄▅▆▇█"
SORT_HELP = "keys: d depth, r rate, l latency, n name, q quit"


def sparkline(values: list[int], width: int = 20) -> str:
    """Depth over the last samples, from the lowest of them (blank) up: a step a message,
    or an eighth of the range when it moved by more than 8. A depth that did not move is a
    blank line however deep (an idle queue's is empty); a flicker of one message, one step."""
    values = values[-width:]
    if not values:
        return ""
    lo, levels = min(values), len(BARS) - 1
    span = max(max(values) - lo, levels)
    return "".join(BARS[round((v - lo) * levels / span)] for v in values)


def spark_cell(values: list[int], width: int) -> str:
    """A sparkline of a fixed width, the newest sample at the right (the column does not
    widen as samples come in)."""
    return sparkline(values, width).rjust(width)


def bar(used: int, limit: int, width: int = 10) -> str:
    filled = min(width, round(width * used / limit)) if limit else 0
    return "█" * filled + "·" * (width - filled)


def num(n: float, compact: bool = False) -> str:
    """``1,234``; compact (narrow terminals) from 10,000 on: ``12.3k``, ``456k``, ``7.8M``."""
    if not compact or abs(n) < 10_000:
        return f"{n:,.0f}"
    for unit, div in (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)):
        v = n / div
        if abs(v) < 999.5 or unit == "T":
            return f"{v:.1f}{unit}" if abs(v) < 99.95 else f"{v:.0f}{unit}"
    return ""  # pragma: no cover


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


# ---------------------------------------------------------------- header


def state_text(m: TopModel) -> Text:
    if m.connected:
        return Text("connected", style="green")
    if m.silent_s is None:
        return Text(f"disconnected, retrying ({m.note})", style="bold red")
    quiet = f"no answer for {m.silent_s:.1f}s"
    return Text(f"disconnected, retrying ({m.note}): {quiet}" if m.note else quiet, style="bold red")


def middle_cut(s: str, n: int) -> str:
    """``s`` in at most ``n`` cells, its middle replaced by "…" if need be."""
    if len(s) <= n:
        return s
    head = (n - 1) // 3
    return s[:head] + "…" + s[len(s) - (n - 1 - head):]


def wrap_chunks(chunks: Sequence[Text | str], sep: str, width: int) -> list[Text]:
    """The chunks joined by ``sep`` into lines of at most ``width`` (a chunk is never split
    unless it alone is wider)."""
    lines: list[Text] = []
    for chunk in chunks:
        chunk = Text(chunk) if isinstance(chunk, str) else chunk
        if lines and cell_len(lines[-1].plain) + len(sep) + cell_len(chunk.plain) <= width:
            lines[-1].append(sep)
            lines[-1].append_text(chunk)
        else:
            lines.append(chunk.copy())
    return lines


def header(m: TopModel, width: int = 200) -> Panel:
    r, inner = m.rates, max(width - 4, 20)  # the panel's border and padding
    state, rest = state_text(m), [m.version, f"up {human_ms(m.uptime_ms)}"]
    room = inner - len("zq top ") - sum(len(x) + 2 for x in rest) - len(state.plain) - 2
    endpoint = middle_cut(m.endpoint, max(room, 24))  # a long ipc path: its start and its end
    lines = wrap_chunks([Text.assemble(("zq top", "bold"), f" {endpoint}"), *rest, state], "  ", inner)
    lines += wrap_chunks([f"durability {m.durability}",
                          f"journal {human_bytes(m.journal_bytes)} of map {human_bytes(m.journal_map_bytes)}",
                          f"publish {r.get('publish', 0):,.0f}/s  deliver {r.get('deliver', 0):,.0f}/s  "
                          f"ack {r.get('ack', 0):,.0f}/s",
                          f"publishers {m.publishers}  workers {m.workers}"]
                         + ([f"{len(m.queues):,} busiest of {m.queues_total:,} queues"] if m.queues_total > len(m.queues)
                            else []), "   ", inner)
    c = m.cluster
    if c:
        isr = ", ".join(str(n)[:24] for n in c.get("isr", [])[:8])
        lines.append(Text(f"cluster: {c.get('role')} {str(c.get('node'))[:24]}  epoch {c.get('epoch')}   in sync: {isr}"
                          + ("" if c.get("serving", True) else "   NOT SERVING (fenced)"),
                          style="" if c.get("serving", True) else "bold red"))
    if m.standbys or m.replicas_ack:
        copies = ", ".join(f"{(s.get('node') or s['name'])[:24]} lag {s['lag_records']:,}"
                           + (f" / {human_ms(s['lag_ms'])}" if s.get("lag_ms") is not None else "")
                           + ("" if s.get("in_sync") in (None, True) else " (out of sync)")
                           for s in m.standbys[:4]) or "none connected"
        lines.append(Text(f"standbys: {copies}" + (f"   confirmations wait for {m.replicas_ack}" if m.replicas_ack else ""),
                          style="" if len(m.standbys) >= m.replicas_ack else "bold red"))
    return Panel(Group(*lines), padding=(0, 1))


# ---------------------------------------------------------------- tables that fit their width


@dataclass(frozen=True)
class Col:
    header: str
    rank: int  # the higher, the sooner it goes when the width is short (0: always shown)
    cell: Callable[[Any, bool], str]  # (row, compact) -> text
    justify: str = "right"


QUEUE_COLUMNS = (
    Col("queue", 0, lambda q, c: q.name, "left"),
    Col("depth", 1, lambda q, c: num(q.depth, c)),
    Col("delay", 11, lambda q, c: num(q.delayed, c)),
    Col("leased", 4, lambda q, c: num(q.leased, c)),
    Col("in/s", 2, lambda q, c: num(q.in_rate, c)),
    Col("out/s", 3, lambda q, c: num(q.out_rate, c)),
    Col("oldest", 6, lambda q, c: human_ms(q.oldest_ms)),
    Col("redel", 10, lambda q, c: num(q.redelivered, c)),
    Col("lost", 12, lambda q, c: num(q.lost, c)),
    Col("exp", 13, lambda q, c: num(q.expired, c)),
    Col("dead", 9, lambda q, c: num(q.dead_lettered, c)),
    Col("cons", 7, lambda q, c: str(q.consumers)),
    Col("p50", 14, lambda q, c: human_ms(q.p50_ms)),
    Col("p99", 8, lambda q, c: human_ms(q.p99_ms)),
    Col("1 min", 5, lambda q, c: spark_cell(q.depth_history, 10 if c else 12), "left"),
)

CONSUMER_COLUMNS = (
    Col("worker", 0, lambda w, c: w.name, "left"),
    Col("queue", 1, lambda w, c: w.queue, "left"),
    Col("backlog", 3, lambda w, c: f"{bar(w.used, w.backlog, 5 if c else 10)} {w.used}/{w.backlog}", "left"),
    Col("acks/s", 2, lambda w, c: num(w.ack_rate, c)),
    Col("mean processing", 5, lambda w, c: human_ms(w.mean_ms)),
    Col("last heard", 4, lambda w, c: human_ms(w.heard_ms_ago) + " ago" if w.heard_ms_ago is not None else "-"),
    Col("given back", 6, lambda w, c: num(w.given_back, c) if w.given_back is not None else "-"),
)


@dataclass
class Fitted:
    cols: list[Col]
    compact: bool
    cells: dict[str, list[str]]  # by header
    widths: list[int]
    width: int  # of the whole table
    name_max: int | None  # the first (name) column cut to this many cells, when even that is needed


def fit_columns(cols: Sequence[Col], rows: Sequence[Any], width: int, gap: int, edge: int) -> Fitted:
    """The columns shown in ``width``: all with full numbers when they fit; else compact
    numbers, dropping the highest ``rank`` first; at last the first (name) column is cut.
    ``gap``: cells between two columns; ``edge``: cells of both edges together."""
    cache: dict[tuple[str, bool], tuple[list[str], int]] = {}

    def cells(col: Col, compact: bool) -> tuple[list[str], int]:
        key = (col.header, compact)
        if key not in cache:
            texts = [col.cell(r, compact) for r in rows]
            cache[key] = texts, max([cell_len(col.header), *(cell_len(t) for t in texts)])
        return cache[key]

    def need(kept: list[Col], compact: bool) -> int:
        return sum(cells(c, compact)[1] for c in kept) + gap * (len(kept) - 1) + edge

    kept, compact = list(cols), False
    if need(kept, False) > width:
        compact = True
        while need(kept, True) > width and len(kept) > 2:
            kept.remove(max(kept, key=lambda c: c.rank))
    widths = [cells(c, compact)[1] for c in kept]
    total, name_max = need(kept, compact), None
    if total > width:  # a very long name: cut it (never a header below its own width)
        name_max = max(cell_len(kept[0].header), widths[0] - (total - width))
        total -= widths[0] - name_max
        widths[0] = name_max
    return Fitted(kept, compact, {c.header: cells(c, compact)[0] for c in kept}, widths, total, name_max)


def make_table(title: str | None, fitted: Fitted, n_rows: int, *, edge: bool, collapse: bool) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=collapse,
              show_edge=edge)
    for i, col in enumerate(fitted.cols):
        cut = i == 0 and fitted.name_max is not None
        t.add_column(col.header, justify=col.justify, no_wrap=True,  # type: ignore[arg-type]
                     max_width=fitted.name_max if cut else None, overflow="ellipsis" if cut else "fold")
    for i in range(n_rows):
        t.add_row(*(fitted.cells[c.header][i] for c in fitted.cols))
    return t


def queue_rows(m: TopModel, shown: int | None) -> tuple[list[QueueRow], str | None]:
    """The queues shown (all, or ``shown`` of them: the busy ones first, in the sort order,
    then the idle ones) and the line saying what was left out."""
    if shown is None or shown >= len(m.queues):
        return list(m.queues), None
    ordered = [q for q in m.queues if not is_idle(q)] + [q for q in m.queues if is_idle(q)]
    rows, rest = ordered[:shown], ordered[shown:]
    idle = sum(is_idle(q) for q in rest)
    if idle == len(rest):
        s = "" if idle == 1 else "s"
        return rows, f"+ {idle} idle queue{s}: " + ", ".join(q.name for q in rest)
    return rows, f"+ {len(rest)} more queues ({idle} idle)"


def queues_table(m: TopModel, width: int = 200, rows: list[QueueRow] | None = None, edge: bool = True) -> Table:
    rows = list(m.queues) if rows is None else rows
    fitted = fit_columns(QUEUE_COLUMNS, rows, width, gap=2, edge=2 if edge else 0)
    titles = [f"queues (sorted by {m.sort}; {SORT_HELP})", f"queues by {m.sort} (keys d r l n sort, q quit)", "queues"]
    title = next((t for t in titles if cell_len(t) <= max(fitted.width, 1)), titles[-1])
    return make_table(title, fitted, len(rows), edge=edge, collapse=True)


def consumers_table(m: TopModel, width: int = 200, rows: list[ConsumerRow] | None = None, edge: bool = True) -> Table:
    rows = list(m.consumers) if rows is None else rows
    fitted = fit_columns(CONSUMER_COLUMNS, rows, width, gap=3, edge=2 if edge else 0)
    return make_table("consumers", fitted, len(rows), edge=edge, collapse=False)


def holder_label(busiest: dict) -> str:
    """A group's holder: the name it gave at HELLO (short), else its consumer id's start."""
    return (busiest.get("holder") or busiest["owner"])[:12] if busiest.get("holder") != busiest["owner"] \
        else busiest["owner"][:8]


def groups_table(m: TopModel, rows: list | None = None, edge: bool = True, cut: bool = False) -> Table:
    """``cut``: one line a row, the busiest list cut to the width (else it wraps)."""
    t = Table(title="groups", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=edge)
    for col in ("queue", "groups", "in flight"):
        t.add_column(col, no_wrap=True, min_width=len(col))  # (a header is never cut: the busiest list gives way)
    label = "busiest (pending, holder)"  # the long one wraps (or is cut): the counts keep their width
    t.add_column(label, min_width=len(label), no_wrap=cut, overflow="ellipsis" if cut else "fold")
    for g in m.groups if rows is None else rows:
        busiest = ", ".join(f"{b['group']} ({b['pending']}{', ' + holder_label(b) if b['owner'] else ''})" for b in g.busiest)
        t.add_row(g.queue, f"{g.groups:,}", f"{g.in_flight:,}", busiest or "-")
    return t


def tenants_table(m: TopModel, rows: list | None = None, edge: bool = True, cut: bool = False) -> Table:
    t = Table(title="tenants (fair share)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=edge)
    t.add_column("queue", no_wrap=True, min_width=len("queue"))
    label = "holding most (messages, weight)"  # wraps (or is cut): there may be ten
    t.add_column(label, min_width=len(label), no_wrap=cut, overflow="ellipsis" if cut else "fold")
    for row in m.tenants if rows is None else rows:
        t.add_row(row.queue, ", ".join(f"{x['tenant'][:24] or '(none)'} ({x['held']:,}, w{x['weight']})"
                                       for x in row.tenants))
    return t


# ---------------------------------------------------------------- the frame


def full_frame(m: TopModel, width: int) -> Group:
    """Every row of every section (what fits a tall terminal, and ``zq top --once``)."""
    parts: list[RenderableType] = [header(m, width), queues_table(m, width)]
    if m.oldest_why:
        parts.append(Text(m.oldest_why + "\n", overflow="fold"))
    parts.append(consumers_table(m, width))
    if m.groups:
        parts.append(groups_table(m))
    if m.tenants:
        parts.append(tenants_table(m))
    return Group(*parts)


SECTION_LINES = 3  # a section's title, its column headers and their rule


def allocate(avail: int, sizes: Sequence[int], mins: Sequence[int]) -> list[int | None]:
    """Rows per section (queues, consumers, then optional ones) in ``avail`` lines. A shown
    section costs its title lines, its rows, and one line saying what it left out; None: not
    shown. Each first gets its minimum; short of lines the optional sections go (the last
    first), then consumer rows, then queue rows; lines left over go to queues, consumers,
    groups, tenants in that order."""
    shown: list[int | None] = [None if i > 1 and not n else min(n, lo) for i, (n, lo) in enumerate(zip(sizes, mins))]

    def cost() -> int:
        return sum(SECTION_LINES + s + (s < n) for s, n in zip(shown, sizes) if s is not None)

    for i in range(len(sizes) - 1, 1, -1):
        if cost() > avail:
            shown[i] = None
    for i in (1, 0):
        while cost() > avail and shown[i]:
            shown[i] -= 1  # type: ignore[operator]
    for i, n in enumerate(sizes):
        while shown[i] is not None and shown[i] < n:  # type: ignore[operator]
            shown[i] += 1  # type: ignore[operator]
            if cost() > avail:
                shown[i] -= 1  # type: ignore[operator]
                break
    return shown


def more_line(text: str) -> Text:
    return Text(text, style="dim", no_wrap=True, overflow="ellipsis")


def tight_frame(m: TopModel, width: int, height: int, header_lines: int) -> Group:
    """The frame in ``height`` lines: no blank lines around tables, the sections' rows
    shared out (``allocate``), a line for what each left out."""
    why = [Text(m.oldest_why, no_wrap=True, overflow="ellipsis")] if m.oldest_why else []
    sizes = [len(m.queues), len(m.consumers), len(m.groups), len(m.tenants)]
    mins = [min(sizes[0], 5), min(sizes[1], 3), min(sizes[2], 1), min(sizes[3], 1)]
    shown = allocate(height - header_lines - len(why), sizes, mins)
    parts: list[RenderableType] = [header(m, width)]
    rows, rest = queue_rows(m, shown[0])
    parts.append(queues_table(m, width, rows, edge=False))
    if rest:
        parts.append(more_line(rest))
    parts += why
    n = shown[1] or 0
    parts.append(consumers_table(m, width, m.consumers[:n], edge=False))
    if n < len(m.consumers):
        parts.append(more_line(f"+ {len(m.consumers) - n} more consumers"))
    k = shown[2]
    if k is not None and m.groups:
        parts.append(groups_table(m, m.groups[:k], edge=False, cut=True))
        if k < len(m.groups):
            parts.append(more_line(f"+ {len(m.groups) - k} more queues with groups"))
    k = shown[3]
    if k is not None and m.tenants:
        parts.append(tenants_table(m, m.tenants[:k], edge=False, cut=True))
        if k < len(m.tenants):
            parts.append(more_line(f"+ {len(m.tenants) - k} more fair queues"))
    return Group(*parts)


class Frame:
    """A whole ``zq top`` screen, laid out at render time for the console it is drawn on:
    its width, and (``fit_height``) its height."""

    def __init__(self, m: TopModel, fit_height: bool = True) -> None:
        self.m = m
        self.fit_height = fit_height

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        height = (options.height or options.max_height) if self.fit_height else None
        opts = options.reset_height()
        lines = console.render_lines(full_frame(self.m, width), opts, pad=False)
        if height is not None and len(lines) > height:
            head = len(console.render_lines(header(self.m, width), opts, pad=False))
            lines = console.render_lines(tight_frame(self.m, width, height, head), opts, pad=False)[:height]
        for line in lines:
            yield from line
            yield Segment.line()


def render(m: TopModel, fit_height: bool = True) -> Frame:
    """The frame for ``m``; ``fit_height=False``: every row, however tall (``--once``)."""
    return Frame(m, fit_height)
