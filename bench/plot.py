"""PNG plots of bench results (matplotlib, headless)."""

from __future__ import annotations

import re
from pathlib import Path


def number(value: object) -> float | None:
    """A figure as stored: a number, or 'median [min-max]' text from --repeat."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = re.match(r"\s*([\d.]+)", value)
        return float(m.group(1)) if m else None
    return None


def plot(scenario: str, rows: list[dict], meta: dict, out: Path) -> Path | None:
    """One bar chart per scenario with a msgs/s or bytes figure; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = next((k for k in ("e2e_msgs_per_s", "msgs_per_s", "heap_bytes_per_message", "seconds_to_serving",
                            "ns_per_message", "claims_per_s", "rows_per_s", "short_wait_p99_ms")
                if any(k in r for r in rows)), None)
    if key is None and scenario in ("latency", "floors"):
        return plot_latency(rows, meta, out)
    if scenario in ("failover", "faults"):
        return plot_faults(scenario, rows, meta, out)
    if scenario == "idle-queues":
        return plot_idle_queues(rows, meta, out)
    if key is None:
        return None
    labels = [label(r) for r in rows]
    values = [number(r.get(key)) or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    bars = ax.bar(labels, values, color=["#2b6cb0" if lab.startswith("zq") else "#a0aec0" for lab in labels])
    ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 10 else f"{v:.1f}" for v in values], fontsize=8)
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"{scenario} — {meta['cores']} cores, Python {meta['python']}, {meta['date'][:10]}", fontsize=9)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


LATENCY_KEYS = {"publish_to_worker_us": "publish → worker", "round_trip_us": "round trip",
                "handoff_us": "hand-off", "publish_us": "publish call"}


def plot_latency(rows: list[dict], meta: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        key = next(k for k in LATENCY_KEYS if k in row)  # floors' rows: a round trip, a hand-off, a step
        ps = row[key]
        xs = [j + i * width for j in range(len(ps))]
        name = row.get("case") or ", ".join(str(x) for x in (
            row.get("system", "zq"), row["transport"], row.get("clients") or row.get("publisher"),
            f"durability {row.get('durability', '?')}") if x)
        what = LATENCY_KEYS[key]
        ax.bar(xs, [number(v) or 0 for v in ps.values()], width, label=f"{name[:90]} ({what})")
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(3)], ["p50", "p99", "p99.9"])
    ax.set_ylabel("µs")
    ax.legend(fontsize=7)
    ax.set_title(f"latency at {rows[0]['rate']} msg/s — {meta['cores']} cores, {meta['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_faults(scenario: str, rows: list[dict], meta: dict, out: Path) -> Path:
    """failover: each kill's time to the new leader's first delivery, against the 3 s
    target; faults: what was injected and what the checker counted."""
    import matplotlib.pyplot as plt

    row = rows[0]
    fig, ax = plt.subplots(figsize=(8, 4))
    if scenario == "failover":
        values = [number(v) or 0.0 for v in row["each_ms"]]
        ax.bar([str(i + 1) for i in range(len(values))], values, color="#2b6cb0")
        ax.axhline(3000, color="#c53030", linestyle="--", linewidth=1, label="target p99: 3 s")
        ax.set_xlabel("kill")
        ax.set_ylabel("ms to the new leader's first delivery")
        ax.legend(fontsize=8)
    else:
        keys = ["leader_killed", "leader_paused", "standby_killed", "epochs", "lost", "twice", "group_order_breaks"]
        values = [number(row.get(k)) or 0.0 for k in keys]
        bars = ax.bar([k.replace("_", " ") for k in keys], values,
                      color=["#a0aec0"] * 4 + ["#2b6cb0"] * 3)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.set_ylabel(f"count ({row.get('confirmed', 0):,} confirmed)")
    ax.set_title(f"{scenario} — {meta['cores']} cores, Python {meta['python']}, {meta['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_idle_queues(rows: list[dict], meta: dict, out: Path) -> Path:
    """An engine step's cost, and publish -> worker p50 / p99, by the number of idle queues."""
    import matplotlib.pyplot as plt

    steps = [r for r in rows if "us_per_step" in r]
    lat = [r for r in rows if "publish_to_worker_us" in r]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar([str(r["idle_queues"]) for r in steps], [r["us_per_step"] for r in steps], color="#2b6cb0")
    a.set_xlabel("idle queues")
    a.set_ylabel("µs per engine step")
    for p, color in (("p50", "#2b6cb0"), ("p99", "#a0aec0")):
        b.plot([r["idle_queues"] for r in lat], [r["publish_to_worker_us"][p] for r in lat], "o-", color=color, label=p)
    b.set_xlabel("idle queues")
    b.set_ylabel("publish → worker µs")
    b.legend()
    fig.suptitle(f"idle-queues — {meta['cores']} cores, Python {meta['python']}, {meta['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def label(row: dict) -> str:
    if "system" in row:
        return str(row["system"])
    if "case" in row:
        return "zq " + str(row["case"])[:28]
    parts = [str(row.get(k)) for k in ("durability", "publish", "backlog", "groups", "queued") if row.get(k) not in (None, 0)]
    return "zq " + " ".join(parts)
