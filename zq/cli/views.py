"""Pure renderers: stats dicts in, rich renderables out (tested with recorded output)."""

from __future__ import annotations

import time

from rich import box
from rich.table import Table

from zq.core.explain import duration_text


STATS_COLUMNS = ("queue", "depth", "delay", "leased", "pub", "acked", "redel", "failed", "exp", "dead", "groups", "cons")
STATS_NOTE = ("depth, delay (of them, waiting for a retry or a publish's delay), leased: now; pub, acked, "
              "redel(ivered), failed (cancels naming an error), exp(ired), dead: since this start; "
              "cons: consumers, then leased / backlog over all of them")


def stats_rows(st: dict) -> tuple[str, list[str], list[list[str]], str]:
    """(title, columns, rows, note) of ``zq stats``: one row per queue."""
    server = st.get("server", {})
    title = f"zq {server.get('version', '')}  uptime {duration_text(server.get('uptime_ms', 0))}  " \
            f"durability {server.get('durability', '?')}  journal {server.get('journal_bytes', 0) / 2**20:.1f} MiB"
    rows = []
    for name, q in sorted(st.get("queues", {}).items()):
        consumers = q.get("consumers", [])
        kind = q.get("kind")
        rows.append([
            f"{name} ({kind})" if kind else name,
            f"{q['depth']}+{q['inactive']}" if q.get("inactive") else str(q["depth"]),  # +N: journal-only (tqd)
            str(q.get("delayed", 0)), str(q["leased"]), str(q["published"]), str(q["acked"]), str(q["redelivered"]),
            str(q.get("failed", 0)),
            str(q["expired"]), str(q["dead_lettered"]), str(q["groups"]),
            f"{len(consumers)} {sum(c['used'] for c in consumers)}/{sum(c['backlog'] for c in consumers)}",
        ])
    return title, list(STATS_COLUMNS), rows, STATS_NOTE


def queue_rows(queues: list[dict], stats: dict) -> tuple[str, list[str], list[list[str]], str]:
    """(title, columns, rows, note) of ``zq queue list``."""
    rows = []
    for q in sorted(queues, key=lambda q: q["name"]):
        st = stats.get(q["name"], {})
        rows.append([q["name"], st.get("kind") or "fifo", q.get("topics") or q["name"], q["semantics"],
                     str(st.get("depth", "")), str(len(st.get("consumers", [])))])
    return "", ["queue", "kind", "topics", "semantics", "depth", "consumers"], rows, ""


def queue_summary(s: dict) -> str:
    """A queue's settings in one line, the ones a user chose or must know."""
    fairness = s.get("fairness") or ("round-robin" if s["semantics"] == "at-most-once" else "proportional")
    parts = [f"topics {s.get('topics') or s['name']}", s["semantics"], f"{fairness} fairness",
             f"lease {s['lease_ms'] / 1000:g}s", f"backlog {s['max_per_subscription_backlog']}",
             f"max {s['max_deliveries']} deliveries" if s.get("max_deliveries") else "no delivery limit",
             f"dead letters to {s['dead_letter']}" if s.get("dead_letter") else "no dead-letter topic"]
    for key in ("filter", "priority", "sort_key", "lvq_key", "barrier"):
        if s.get(key):
            parts.append(f"{key} {s[key]}")
    if s.get("browse_only"):
        parts.append("browse-only")
    if s.get("max_depth") or s.get("max_bytes"):
        parts.append(f"overflow {s['overflow']}")
    if s.get("max_lease_age_ms"):
        parts.append(f"leases renew up to {s['max_lease_age_ms'] / 1000:g}s")
    if s.get("backoff_ms"):
        parts.append("backoff " + ",".join(f"{ms / 1000:g}s" for ms in s["backoff_ms"]))
    if s.get("tenant_header"):
        weights = ", ".join(f"{t}={w}" for t, w in sorted(s.get("tenant_weights", {}).items())[:5])
        more = len(s.get("tenant_weights", {})) - 5
        parts.append(f"tenants by {s['tenant_header']} (weights {weights or 'equal'}"
                     f"{f' and {more} more' if more > 0 else ''}, others {s.get('tenant_default_weight', 1)})")
    if s.get("priority_aging"):
        parts.append(f"priority ages: a level is worth {s['priority_aging']} messages")
    return ", ".join(parts)


def grid(title: str, columns: list[str], rows: list[list[str]], note: str) -> Table:
    """A rich table that never cuts a name or a number: every column is as wide as its
    widest cell (print it on a console at least ``fitted_width`` wide)."""
    table = Table(title=title or None, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=note or None, caption_justify="left")
    for i, (col, width) in enumerate(zip(columns, column_widths(columns, rows))):
        if i == 0:
            table.add_column(col, justify="left", overflow="fold", min_width=width)
        else:
            table.add_column(col, justify="right" if all(_numeric(r[i]) for r in rows) else "left",
                             no_wrap=True, min_width=width)
    for row in rows:
        table.add_row(*row)
    return table


def plain(title: str, columns: list[str], rows: list[list[str]], note: str) -> str:
    """The same table for a pipe or a file: aligned columns, no box characters, nothing cut."""
    widths = column_widths(columns, rows)
    lines = [title] if title else []
    for cells in (columns, *rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    if note:
        lines.append(note)
    return "\n".join(lines)


def print_table(title: str, columns: list[str], rows: list[list[str]], note: str) -> None:
    """A rich table on a terminal, plain aligned text otherwise (scripts, pipes, files)."""
    import sys

    if sys.stdout.isatty():
        from rich.console import Console

        console = Console(width=fitted_width(columns, rows, Console().width))
        console.print(grid(title, columns, rows, note))
    else:
        print(plain(title, columns, rows, note))


def fitted_width(columns: list[str], rows: list[list[str]], terminal: int) -> int:
    """The terminal's width, or the table's own when wider: then the terminal wraps the
    lines, and nothing is cut or ellipsised."""
    return max(terminal, sum(w + 2 for w in column_widths(columns, rows)) + 2)


def column_widths(columns: list[str], rows: list[list[str]]) -> list[int]:
    """Each column's widest cell, its header included."""
    return [max([len(col), *(len(r[i]) for r in rows)]) for i, col in enumerate(columns)]


def _numeric(cell: str) -> bool:
    return cell.replace("+", "").replace("/", "").replace(" ", "").isdigit() or not cell


def print_rows(rows: list[dict], columns: list[str]) -> None:
    """Query answers and group lists: a row per key, a column per key and aggregate."""
    cells = [["NULL" if row.get(c) is None else f"{row[c]:.6g}" if isinstance(row.get(c), float) else str(row.get(c))
              for c in columns] for row in rows]
    print_table("", columns, cells, "")


def clock_text(ms: int) -> str:
    """Unix ms as UTC to the millisecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def local_time(ms: int) -> str:
    """Unix ms as this machine's local time to the second: ``2026-11-26 20:14:03``."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def due_text(not_before_ms: int, now_ms: int) -> str:
    """When a delayed message may go, for a person: ``2026-11-26 20:14:03 (in 59m 54s)``."""
    wait = not_before_ms - now_ms
    return f"{local_time(not_before_ms)} ({f'in {duration_text(wait)}' if wait > 0 else 'due now'})"


def explain_text(doc: dict) -> str:
    """``zq explain``'s answer for a person: the state and why, then the history."""
    facts = [f"topic {doc['topic']}" if doc.get("topic") else None,
             f"published {duration_text(doc['published_ms_ago'])} ago" if "published_ms_ago" in doc else None,
             f"msg_id {doc['msg_id']}" if doc.get("msg_id") else None,
             f"group {doc['group']}" if doc.get("group") else None,
             f"{doc['deliveries']} deliveries" if doc.get("deliveries") else None,
             f"{doc['reclaimed']} given back unstarted, not counted" if doc.get("reclaimed") else None,
             f"{doc['cancels']} cancels" if doc.get("cancels") else None]
    head = f"{doc['queue']} {doc['bookmark']}: {doc['state']}"
    known = [f for f in facts if f]
    lines = [head + (f" ({', '.join(known)})" if known else "")]
    at = f" (at {local_time(doc['not_before_ms'])})" if doc.get("not_before_ms") is not None else ""
    lines += [f"  {reason}{at if ': due in ' in reason else ''}" for reason in doc.get("why", [])]
    c = doc.get("causes")
    if c:
        counts = ", ".join(f"{n} {label}" for n, label in ((c["cancelled"], "cancelled"), (c["failed"], "failed"),
                                                            (c["lease_expired"], "lease expired"),
                                                            (c["consumer_gone"], "consumer gone")) if n)
        last = f"; last error {c['last_error']!r}" if c.get("last_error") else ""
        who = f"; last consumer {c['last_consumer']}" if c.get("last_consumer") else ""
        lines.append(f"  unfinished deliveries: {counts or 'none'}{last}{who}")
    events = doc.get("history", [])
    if events:
        lines.append("history:" if doc.get("history_complete", True) else
                     "history (the journal scan stopped at its budget: older events only):")
        for ev in events:
            when = clock_text(ev["ts_ms"])
            who = ev.get("name") or ev.get("consumer") or ""
            extra = f" delivery {ev['deliveries']}" if ev.get("deliveries") else ""
            reason = f" ({ev['reason']}: {ev['error']})" if ev.get("error") else f" ({ev['reason']})" if ev.get("reason") else ""
            until = f" until {clock_text(ev['due_ms'])}" if "due_ms" in ev else ""
            lines.append(f"  {when}  {ev['kind']:<12} {who}{extra}{until}{reason}")
    elif "history" in doc:
        lines.append("history: no delivery events")
    return "\n".join(lines)


def replication_lines(st: dict) -> list[str]:
    """Under `zq stats`'s table: a cluster leader's role, epoch and in-sync set, and each
    standby's lag in records and ms (nothing for a dispatcher without standbys)."""
    rep = st.get("server", {}).get("replication") or {}
    lines = []
    c = rep.get("cluster")
    if c:
        lines.append(f"cluster: {c['role']} {c['node']}, epoch {c['epoch']}, in sync: {', '.join(c['isr'])}"
                     + ("" if c.get("serving", True) else " (NOT SERVING: fenced)"))
    for s in rep.get("standbys", []):
        lag_ms = f" / {s['lag_ms']:,} ms" if s.get("lag_ms") is not None else ""
        sync = "" if s.get("in_sync") in (None, True) else " (out of sync)"
        lines.append(f"standby {s.get('node') or s['name']}: lag {s['lag_records']:,} records{lag_ms}{sync}")
    if rep.get("replicas_ack"):
        who = (f"every in-sync standby (at least {rep['replicas_ack']})" if c
               else f"{rep['replicas_ack']} standby(s)")
        lines.append(f"confirmations wait for {who}; held now: {rep.get('held_confirmations', 0)}")
    return lines
