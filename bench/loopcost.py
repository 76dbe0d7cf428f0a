"""Where the dispatcher loop's thread spends its CPU, per iteration (issue #34).

``python -m bench run loop-cost`` runs the standard workload and the latency scenario's
2,000 msg/s through a ``zq serve`` whose loop is wrapped with counters: each named step
(reading the frames, the commit, reading records for DELIVER, the sends, ``poll``, the
whole iteration) adds up the loop thread's CPU clock (``time.thread_time``) while it
runs. A row gives each step's µs of CPU per iteration and per message, and its calls
per iteration. The counters cost about 0.6 µs a call (two clock reads), so the total is a
little above the loop's own cost; compare steps within a row, and rows with each other.

Beside them, the journal's commit alone (``LmdbJournal.append`` + ``commit``: 32 messages
and an event, about what an iteration of the standard workload stages (it stages ~33
and ~4 events); and one message and one event, the low rate's), in a warm loop and never
reaching the once-a-second sync: roughly what a commit costs without the other processes
on the two cores.

``python -m bench.loopcost serve ...`` is the counting server (``zq serve``'s arguments);
it writes its counters as JSON to ``$ZQ_LOOPCOST_OUT`` when it exits.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench import e2e

# (class path, method, label): the loop's steps, each counted with the thread's CPU clock.
COUNTED = (
    ("zq.server.loop.Server", "serve_once", "iteration (after poll)"),
    ("zq.server.loop.Server", "receive_all", "reading frames and their handlers"),
    ("zq.server.loop.Server", "commit_and_send", "commit and sends"),
    ("zq.journal.lmdb_journal.LmdbJournal", "commit", "the journal's commit"),
    ("zq.server.loop.Server", "send_deliveries", "DELIVER frames"),
    ("zq.journal.lmdb_journal.LmdbJournal", "get_raw", "reading records for DELIVER"),
    ("zq.server.loop.Server", "send", "sends (one frame each)"),
    ("zmq.Poller", "poll", "poll"),
)


def counted(method: Callable, label: str, totals: dict[str, list[float]]) -> Callable:
    clock = time.thread_time
    slot = totals.setdefault(label, [0.0, 0])

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return method(*args, **kwargs)
        finally:
            slot[0] += clock() - started
            slot[1] += 1

    return wrapper


def serve(argv: list[str]) -> None:
    """``zq serve`` with the loop's steps counted; the counters go to $ZQ_LOOPCOST_OUT at exit."""
    import importlib

    totals: dict[str, list[float]] = {}
    for path, name, label in COUNTED:
        module, _, cls_name = path.rpartition(".")
        cls = getattr(importlib.import_module(module), cls_name)
        setattr(cls, name, counted(getattr(cls, name), label, totals))
    out = os.environ["ZQ_LOOPCOST_OUT"]
    atexit.register(lambda: Path(out).write_text(json.dumps({k: v for k, v in totals.items()})))
    from zq.cli.app import command

    command()(args=argv, prog_name="zq")


def row(case: str, messages: int, totals: dict[str, list[float]], extra: dict) -> dict:
    iterations = totals["iteration (after poll)"][1] or 1
    steps = {label: {"us_per_iteration": round(cpu / iterations * 1e6, 1),
                     "us_per_message": round(cpu / messages * 1e6, 2),
                     "calls_per_iteration": round(calls / iterations, 2)}
             for label, (cpu, calls) in totals.items()}
    return {"scenario": "loop-cost", "case": case, "messages": messages, "iterations": iterations,
            "messages_per_iteration": round(messages / iterations, 1), **extra, "steps": steps}


def in_counting_server(case: str, run: Callable[[], dict], messages: Callable[[dict], int]) -> dict:
    with tempfile.TemporaryDirectory(prefix="zq-loopcost-") as tmp:
        out = Path(tmp) / "counters.json"
        os.environ["ZQ_LOOPCOST_OUT"] = str(out)  # inherited by the server (bench.e2e.child_env)
        try:
            result = run()
        finally:
            del os.environ["ZQ_LOOPCOST_OUT"]
        totals = json.loads(out.read_text())
    extra = {k: result[k] for k in ("e2e_msgs_per_s", "publish_to_worker_us", "server_cpu_us_per_msg") if k in result}
    return row(case, messages(result), totals, extra)


def journal_commit(commits: int) -> list[dict]:
    """The journal's commit alone, warm: what one iteration stages at each rate."""
    from zq.core import records as R
    from zq.journal.lmdb_journal import LmdbJournal

    rows = []
    payload = b"x" * 128
    with tempfile.TemporaryDirectory(prefix="zq-loopcost-journal-") as tmp:
        journal = LmdbJournal(f"{tmp}/journal")
        seq = 0
        try:
            for messages in (32, 1):
                cpu = 0.0
                for _ in range(commits):
                    staged: list[object] = []
                    for _ in range(messages):
                        seq += 1
                        staged.append(R.Message(seq, 0, "bench", payload, {}, None))
                    seq += 1
                    staged.append(R.Event(seq, 0, R.ACKED, "bench", "c", list(range(seq - messages, seq)), [1] * messages))
                    started = time.thread_time()
                    journal.append(staged)
                    journal.commit(0)
                    cpu += time.thread_time() - started
                rows.append({"scenario": "loop-cost", "case": f"the journal's commit alone, {messages} message(s) + 1 event",
                             "commits": commits, "us_per_commit": round(cpu / commits * 1e6, 1),
                             "us_per_message": round(cpu / commits / messages * 1e6, 2)})
        finally:
            journal.close()
    return rows


def run(quick: bool) -> list[dict]:
    n = 3_000 if quick else 200_000
    seconds = 0.5 if quick else 5.0
    module = "bench.loopcost"
    return [
        in_counting_server("standard workload (zq.Publisher.publish_many + 4 zq.Worker, backlog 16)",
                           lambda: e2e.throughput(n, mode="publisher-many", serve_module=module), lambda r: r["messages"]),
        in_counting_server("2,000 msg/s (zq.Publisher -> 4 zq.Worker)",
                           lambda: e2e.latency(seconds, publisher="paced-publisher", serve_module=module),
                           lambda r: int(seconds * 2000)),
        *journal_commit(200 if quick else 5_000),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        raise SystemExit("usage: python -m bench.loopcost serve [zq serve's arguments]")
    serve(sys.argv[1:])
