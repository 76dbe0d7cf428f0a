"""The compiled core against the interpreted one, interleaved in one invocation.

Each round runs the engine alone (a child process, so the build is chosen before zq is
imported) and the standard workload end to end (server, workers and producer all
inherit ``ZQ_PURE``), first compiled, then with ``ZQ_PURE=1``. Noise on a shared VM
hits both alike; the summary rows give the median ratio compiled / interpreted.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from bench import e2e

ENGINE_CASES = ({"backlog": 16}, {"backlog": 256}, {"backlog": 16, "groups": 1000})


def engine_child(n: int) -> list[dict]:
    code = ("import json, zq.build as b; from bench import engine; "
            f"rows = [engine.throughput({n}, batch=64, **case) for case in {list(ENGINE_CASES)!r}]; "
            "print(json.dumps([dict(r, build=b.BUILD) for r in rows]))")
    out = subprocess.run([sys.executable, "-c", code], env=e2e.child_env(), capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def compare(rounds: int, n_engine: int, n_e2e: int) -> list[dict]:
    rows: list[dict] = []
    was = os.environ.pop("ZQ_PURE", None)
    try:
        for r in range(rounds):
            for build in ("compiled", "interpreted"):
                if build == "interpreted":
                    os.environ["ZQ_PURE"] = "1"
                else:
                    os.environ.pop("ZQ_PURE", None)
                for row in engine_child(n_engine):
                    rows.append({**row, "scenario": "build", "round": r, "figure": "engine", "build": row["build"]})
                rows.append({**e2e.throughput(n_e2e), "scenario": "build", "round": r, "figure": "standard workload",
                             "build": build})
    finally:
        os.environ.pop("ZQ_PURE", None)
        if was is not None:
            os.environ["ZQ_PURE"] = was
    return rows + summary(rows)


def key(row: dict) -> tuple:
    return (row["figure"], row.get("backlog"), row.get("groups"))


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for k in dict.fromkeys(key(r) for r in rows):
        figure = "msgs_per_s" if k[0] == "engine" else "e2e_msgs_per_s"
        by = {b: [r[figure] for r in rows if key(r) == k and r["build"] == b] for b in ("compiled", "interpreted")}
        if not by["compiled"] or not by["interpreted"]:
            continue
        c, i = statistics.median(by["compiled"]), statistics.median(by["interpreted"])
        row = {"scenario": "build", "figure": f"{k[0]} (median)", "backlog": k[1], "groups": k[2],
               "compiled_msgs_per_s": round(c), "interpreted_msgs_per_s": round(i), "speedup": round(c / i, 2)}
        if k[0] == "standard workload":
            cpu = {b: statistics.median([r["server_cpu_us_per_msg"] for r in rows if key(r) == k and r["build"] == b])
                   for b in ("compiled", "interpreted")}
            row.update(compiled_server_cpu_us_per_msg=cpu["compiled"], interpreted_server_cpu_us_per_msg=cpu["interpreted"])
        out.append(row)
    return out
