"""``zq demo``: an embedded dispatcher, a publisher and a fleet of worker processes.

The workers are real processes (``python -m zq.cli.demo worker ...``) talking ZeroMQ over
loopback to the dispatcher, which runs on a thread of this process with its journal
in a temporary directory. The summary comes from the dispatcher's own stats.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zq.client import Client
from zq.core.settings import QueueSettings
from zq.server.config import Config
from zq.server import Dispatcher

QUEUE = "demo.jobs"
CUSTOMERS = 50


INTERRUPTED = 130  # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)


def run_demo(*, messages: int, workers: int, backlog: int, fail_rate: float, data: str | None) -> int:
    """The demo; Ctrl-C stops it with one line and exit status 130, after it has stopped
    its workers and its dispatcher and removed its temporary journal."""
    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        return fleet(messages=messages, workers=workers, backlog=backlog, fail_rate=fail_rate, data=data)
    except KeyboardInterrupt:
        print("zq demo: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted(signum: int, frame: object) -> None:
    """The first Ctrl-C stops the demo; the ones after it are ignored, so that they do not
    cut short the cleanup it starts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def fleet(*, messages: int, workers: int, backlog: int, fail_rate: float, data: str | None) -> int:
    console = Console(stderr=False)
    tmp: str | None = None
    dispatcher: Dispatcher | None = None
    procs: list[subprocess.Popen] = []
    try:
        if data is None:
            data = tmp = tempfile.mkdtemp(prefix="zq-demo-")
        # Its queue retries a cancelled job after 50 ms (the default waits 1 s, then longer:
        # right for real failures, but a demo's 1 % of cancels would park their customers' groups).
        demo_queue = QueueSettings(name=QUEUE, backoff_ms=[50], dead_letter=f"{QUEUE}.dead")
        config = Config(data=data, bind=["tcp://127.0.0.1:0"], heartbeat_ms=500, queues=[demo_queue])
        dispatcher = Dispatcher(config).start()
        console.print(f"[bold]zq demo[/]: dispatcher on {dispatcher.endpoint}, journal in {config.data}")
        procs += start_workers(dispatcher.endpoint, workers, backlog, fail_rate)
        with Client(dispatcher.inproc, name="demo-publisher") as client:
            wait_for_workers(client, workers)
            console.print(f"zq demo: {workers} workers subscribed; publishing {messages:,} messages")
            elapsed = publish_and_watch(console, client, messages)
            st = client.stats()
        summary(console, st, messages, elapsed, fail_rate)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        if dispatcher is not None:
            dispatcher.stop()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def start_workers(endpoint: str, workers: int, backlog: int, fail_rate: float) -> list[subprocess.Popen]:
    """The worker processes, born ignoring SIGINT (an ignored signal stays ignored across
    exec, and Python keeps it so): a Ctrl-C at the terminal reaches the whole process
    group, and the workers leave it to the demo, which stops them with SIGTERM."""
    procs: list[subprocess.Popen] = []
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for i in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "zq.cli.demo", "worker", endpoint, f"worker-{i + 1}", str(backlog), str(fail_rate)],
            ))
    finally:
        signal.signal(signal.SIGINT, handler)
    return procs


def wait_for_workers(client: Client, workers: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = client.stats()["queues"].get(QUEUE)
        if q and len(q["consumers"]) >= workers:
            return
        time.sleep(0.05)
    raise SystemExit(f"zq demo: only some of the {workers} workers subscribed within {timeout}s")


def publish_and_watch(console: Console, client: Client, messages: int) -> float:
    rng = random.Random(42)
    start = time.monotonic()
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        published = progress.add_task("published", total=messages)
        acked = progress.add_task("acked    ", total=messages)
        futures = []
        for i in range(messages):
            futures.append(client.publish_async(QUEUE, f"job {i}".encode(), group=f"customer-{rng.randrange(CUSTOMERS)}"))
            if i % 512 == 511:
                progress.update(published, completed=sum(f.done() for f in futures))
                progress.update(acked, completed=client.stats()["queues"][QUEUE]["acked"])
        for f in futures:
            f.result(60)
        progress.update(published, completed=messages)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = client.stats()["queues"][QUEUE]["acked"]
            progress.update(acked, completed=done)
            if done >= messages:
                break
            time.sleep(0.05)
    return time.monotonic() - start


def summary(console: Console, st: dict, messages: int, elapsed: float, fail_rate: float = 0.0) -> None:
    q = st["queues"][QUEUE]
    table = Table(title="zq demo: summary", title_justify="left")
    table.add_column("worker")
    table.add_column("acked", justify="right")
    table.add_column("share", justify="right")
    total = sum(c["acked"] for c in q["consumers"]) or 1
    for c in sorted(q["consumers"], key=lambda c: c.get("name", "")):
        table.add_row(c.get("name") or c["consumer"], str(c["acked"]), f"{100 * c['acked'] / total:.1f}%")
    console.print(table)
    console.print(
        f"messages {messages}, acked {q['acked']}, in {elapsed:.2f}s = {q['acked'] / elapsed:,.0f} msgs/s end to end; "
        f"redeliveries {q['redelivered']} (the workers cancel {fail_rate:.0%} of jobs on purpose, --fail-rate: "
        f"{q['cancelled']} cancelled, each delivered again), dead-lettered {q['dead_lettered']}, "
        f"groups kept in order: {CUSTOMERS} customers, sequenced"
    )


def worker(endpoint: str, name: str, backlog: int, fail_rate: float) -> None:
    """A demo worker: 'processes' each job, cancels a few to show redelivery. It stops
    on SIGTERM (the demo's), or when the demo is gone (it is no longer its parent)."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the demo's to handle
    parent = os.getppid()
    rng = random.Random(name)
    with Client(endpoint, name=name) as client, client.subscribe(QUEUE, max_backlog=backlog) as sub:
        while not stop and os.getppid() == parent:
            msg = sub.get(timeout=0.2)
            if msg is None:
                continue
            if msg.deliveries == 1 and rng.random() < fail_rate:
                msg.cancel()
            else:
                msg.ack()


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    else:
        sys.exit("usage: python -m zq.cli.demo worker ENDPOINT NAME BACKLOG FAIL_RATE")
