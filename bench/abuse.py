"""Abuse: what one peer, within its rights, does to everyone else (issue 32 §3).

Each pattern of ``zq.testing.abuse.PATTERNS`` runs against a fresh ``zq serve`` at its
default limits (tcp loopback, durability batch), with a bystander process doing round
trips the whole time (a STATS, then a publish and consume of one message) and the
abuser in its own process. One row per pattern: the bystander's round trips while the
pattern ran (p50 / p99 / max ms, failures), the server's memory (VmHWM, and RssAnon's
growth), how long the pattern took, whether a fresh client was still served, and the
verdict against the rule (every round trip < 100 ms, no failure, memory growth <=
``MEMORY_BOUND_MIB``, a fresh client served). ``--quick`` runs each at the test suite's
small scale, without it at the large one (as large as runs in about a minute here).
"""

from __future__ import annotations

from typing import Any


def row(r: dict[str, Any]) -> dict[str, Any]:
    """One result row: the headline figures flat, the pattern's own figures beside them."""
    b = r.get("bystander_ms") or {}
    mem = r.get("server_memory", {})
    out: dict[str, Any] = {
        "pattern": r["pattern"],
        "scale": r["scale"],
        "bystander_p50_ms": b.get("p50"),
        "bystander_p99_ms": b.get("p99"),
        "bystander_max_ms": b.get("max"),
        "bystander_failures": r.get("bystander_failures"),
        "bystander_longest_gap_ms": r.get("bystander_longest_gap_ms"),
        "server_rss_peak_mib": mem.get("vmhwm_mib"),
        "server_anon_growth_mib": mem.get("anon_growth_mib"),
        "pattern_s": r.get("pattern_s"),
        "fresh_client_ok": (r.get("probe_during") or {}).get("ok"),
        "verdict": "ok" if r["verdict"]["ok"] else "broken: " + "; ".join(r["verdict"]["why"]),
        "abuser": r.get("abuser", {}),
        "probe_before": r.get("probe_before", {}),
        "probe_during": r.get("probe_during", {}),
        "phases": r.get("phases", {}),
        "watchdog": r.get("server_watchdog", {}),
    }
    for key in ("disk", "restart_s"):
        if key in r:
            out[key] = r[key]
    return out


def run(quick: bool) -> list[dict]:
    from zq.testing.abuse import CONTROL, PATTERNS, run_pattern, table

    results = [run_pattern("control", CONTROL.small if quick else CONTROL.large)]
    results += [run_pattern(name, large=not quick) for name in PATTERNS]
    print(table(results))
    return [row(r) for r in results]
