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


def versus(ref: str, rounds: int, n: int) -> list[dict]:
    """The engine of git revision ``ref`` against this tree's, interleaved in one
    invocation: what a change cost the engine. ``ref``'s core is compiled (as
    installed) in a scratch copy; each run is a child process that imports zq from
    one tree or the other and runs this tree's workload (``bench.engine``)."""
    import shutil
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix=f"zq-{sha}-"))
    try:
        archive = subprocess.run(["git", "archive", sha], cwd=root, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        built = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=scratch,
                               capture_output=True, text=True, timeout=900)
        if built.returncode:
            raise RuntimeError(f"building {sha}'s core failed: {built.stderr[-2000:]}")
        rows: list[dict] = []
        for r in range(rounds):
            for label, tree in ((sha, scratch), ("this tree", root)):
                for row in versus_child(tree, root, n):
                    rows.append({**row, "scenario": "engine-vs", "round": r, "code": label})
        return rows + versus_summary(rows, sha)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def versus_child(tree: object, root: object, n: int) -> list[dict]:
    code = (f"import sys; sys.path.insert(0, {str(tree)!r}); import json, zq, zq.build as b; "
            f"assert zq.__file__.startswith({str(tree)!r}), zq.__file__; sys.path.insert(0, {str(root)!r}); "
            "from bench import engine; "
            f"rows = [engine.throughput({n}, batch=64, **case) for case in {list(ENGINE_CASES)!r}]; "
            "print(json.dumps([dict(r, build=b.BUILD) for r in rows]))")
    out = subprocess.run([sys.executable, "-c", code], env={k: v for k, v in os.environ.items() if k != "ZQ_PURE"},
                         capture_output=True, text=True, timeout=900, cwd="/")
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout)


def versus_summary(rows: list[dict], sha: str) -> list[dict]:
    out = []
    for case in ENGINE_CASES:
        same = [r for r in rows if r.get("backlog") == case["backlog"] and (r.get("groups") or 0) == case.get("groups", 0)]
        before = statistics.median(r["msgs_per_s"] for r in same if r["code"] == sha)
        after = statistics.median(r["msgs_per_s"] for r in same if r["code"] == "this tree")
        cpu_before = statistics.median(r["cpu_us_per_msg"] for r in same if r["code"] == sha)
        cpu_after = statistics.median(r["cpu_us_per_msg"] for r in same if r["code"] == "this tree")
        out.append({"scenario": "engine-vs", "figure": "median", **case, f"{sha}_msgs_per_s": round(before),
                    "this_tree_msgs_per_s": round(after), "ratio": round(after / before, 3),
                    f"{sha}_cpu_us_per_msg": cpu_before, "this_tree_cpu_us_per_msg": cpu_after,
                    "cpu_ratio": round(cpu_after / cpu_before, 3), "builds": sorted({r["build"] for r in same})})
    return out
