"""Pure renderers: stats dicts in, rich renderables out (tested with recorded output)."""

from __future__ import annotations

from rich import box
from rich.table import Table


def stats_table(st: dict) -> Table:
    server = st.get("server", {})
    title = f"zq {server.get('version', '')}  uptime {server.get('uptime_ms', 0) / 1000:.0f}s  " \
            f"durability {server.get('durability', '?')}  journal {server.get('journal_bytes', 0) / 2**20:.1f} MiB"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption="depth, leased: now; pub, acked, redel(ivered), exp(ired), dead: since this start; "
                          "cons: consumers, then leased / backlog over all of them",
                  caption_justify="left")
    for col in ("queue", "depth", "leased", "pub", "acked", "redel", "exp", "dead", "groups", "cons"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for name, q in sorted(st.get("queues", {}).items()):
        consumers = q.get("consumers", [])
        kind = q.get("kind")
        table.add_row(
            f"{name} ({kind})" if kind else name,
            f"{q['depth']}+{q['inactive']}" if q.get("inactive") else str(q["depth"]),  # +N: journal-only (tqd)
            str(q["leased"]), str(q["published"]), str(q["acked"]), str(q["redelivered"]),
            str(q["expired"]), str(q["dead_lettered"]), str(q["groups"]),
            f"{len(consumers)} {sum(c['used'] for c in consumers)}/{sum(c['backlog'] for c in consumers)}",
        )
    return table


def rows_table(rows: list[dict], columns: list[str]) -> Table:
    """Query answers: one row per group-by key, a column per key and aggregate."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i < len(columns) - sum(1 for c in columns if "(" in c or c == "count") else "right")
    for row in rows:
        table.add_row(*("NULL" if row.get(c) is None else f"{row[c]:.6g}" if isinstance(row.get(c), float) else str(row.get(c))
                        for c in columns))
    return table
