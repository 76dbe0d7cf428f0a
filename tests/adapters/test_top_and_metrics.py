"""`zq top` in a real terminal (tmux) and `/metrics` scraped over HTTP."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from zq.client import Client

from .support import ROOT, ServerProcess, WorkerProcess, env, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tmux:
    def __init__(self, name: str, command: str, width: int = 140, height: int = 50) -> None:
        self.name = name
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), command],
                       check=True, env=env(), cwd=ROOT)

    def screen(self) -> str:
        out = subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True)
        return out.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.name], capture_output=True).returncode == 0

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def publish_for(endpoint: str, seconds: float, stop: threading.Event) -> None:
    """A bounded publisher: ~200 msg/s until ``seconds`` pass or ``stop`` is set."""
    deadline = time.monotonic() + seconds
    with Client(endpoint) as c:
        while time.monotonic() < deadline and not stop.is_set():
            try:
                c.publish_many("jobs", [b"x"] * 20, timeout=5)
            except Exception:
                pass  # the server is being restarted by the test
            time.sleep(0.1)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux); .ci/run installs it")
def test_zq_top_in_a_terminal_shows_the_fleet_the_lost_server_and_the_recovery(tmp_path):
    server = ServerProcess(tmp_path).start()
    worker = WorkerProcess(server.endpoint, "jobs", tmp_path / "w.log")
    stop = threading.Event()
    pub = threading.Thread(target=publish_for, args=(server.endpoint, 60, stop), daemon=True)
    top = None
    try:
        wait_until(lambda: worker.log.exists(), what="worker subscribed")
        pub.start()
        top = Tmux("zqtop", f"{sys.executable} -m zq.cli top --endpoint {server.endpoint} --interval 0.3")
        def fleet_shown() -> str | None:
            screen = top.screen()
            return screen if "jobs" in screen and "test-ack" in screen else None

        first = wait_until(fleet_shown, what="zq top to show the queue and the worker")
        assert "connected" in first and "queues" in first and "consumers" in first
        assert f":{worker.proc.pid} test-ack" in first, "the worker shows as host:pid and its name"

        def out_rate() -> int:
            for line in top.screen().splitlines():
                cells = line.split()
                if cells[:1] == ["jobs"] and len(cells) > 5:
                    return int(cells[4].replace(",", ""))
            return 0

        wait_until(lambda: out_rate() > 0, what="a non-zero ack rate for jobs")
        server.kill()
        wait_until(lambda: "disconnected, retrying" in top.screen(), timeout=20, what="the disconnected state")
        server.start()
        wait_until(lambda: "connected" in top.screen() and "disconnected" not in top.screen(), timeout=30,
                   what="zq top to recover by itself")
        assert "sorted by rate" in top.screen()  # the busy queues first, by default
        top.keys("d")
        wait_until(lambda: "sorted by depth" in top.screen(), what="the sort key to take effect")
        top.keys("q")
        wait_until(lambda: not top.alive(), what="q to quit")
    finally:
        stop.set()
        if top is not None:
            top.kill()
        worker.stop()
        server.terminate()


IDLE = ["audit-log", "billing", "emails", "exports", "images", "invoices", "ledger", "reports", "search-index",
        "sms", "thumbnails", "webhooks"]


def cells(line: str) -> list[str]:
    """A table line's cells (columns are two or more blanks apart; a header may hold one)."""
    return re.split(r"\s{2,}", line.strip())


def table(screen: list[str], first: str) -> tuple[list[str], list[list[str]], int] | None:
    """A table on the screen: its headers, its rows' cells, and where its header line is."""
    for i, line in enumerate(screen[:-1]):
        if cells(line)[0] == first and "──" in screen[i + 1]:
            rows = []
            for row in screen[i + 2:]:
                if not row.strip() or row.startswith("+ ") or row.startswith("oldest waiting"):
                    break
                rows.append(cells(row))
            return cells(line), rows, i
    return None


def count(cell: str) -> float:
    """A number as ``zq top`` writes it: 1,234 or compact 12.3k / 4.5M."""
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}.get(cell[-1:], 1)
    return float(cell.rstrip("kMG").replace(",", "")) * scale


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux); .ci/run installs it")
def test_zq_top_at_80x24_shows_the_busy_queue_first_and_its_consumers_and_says_when_the_server_is_gone(tmp_path):
    server = ServerProcess(tmp_path).start()
    with Client(server.endpoint) as c:  # example queues holding a few messages each, which nobody touches
        for i, name in enumerate(IDLE):
            c.publish_many(name, [b"x"] * (i + 1))
    workers = [WorkerProcess(server.endpoint, "jobs", tmp_path / f"w{i}.log") for i in range(2)]
    stop = threading.Event()
    pub = threading.Thread(target=publish_for, args=(server.endpoint, 60, stop), daemon=True)
    top = None
    try:
        wait_until(lambda: all(w.log.exists() for w in workers), what="workers subscribed")
        pub.start()
        top = Tmux("zqtop80", f"{sys.executable} -m zq.cli top --endpoint {server.endpoint}", 80, 24)  # 1 s interval

        def busy_and_staffed() -> list[str] | None:
            screen = top.screen().splitlines()
            queues, consumers = table(screen, "queue"), table(screen, "worker")
            if queues is None or consumers is None or not queues[1]:
                return None
            jobs = dict(zip(queues[0], queues[1][0]))
            if jobs.get("queue") != "jobs" or count(jobs["in/s"]) <= 0 or count(jobs["out/s"]) <= 0:
                return None
            return screen if sum("test-ack" in row[0] for row in consumers[1]) == 2 else None

        screen = wait_until(busy_and_staffed, timeout=30, what="zq top to show jobs first, busy, and both workers")
        text = "\n".join(screen)
        assert len(screen) <= 24 and "connected" in text[:text.index("queues")]
        headers, rows, at = table(screen, "queue")  # type: ignore[misc]
        assert {"queue", "depth", "leased", "in/s", "out/s", "1 min"} <= set(headers), headers
        consumer_headers, consumer_rows, _ = table(screen, "worker")  # type: ignore[misc]
        for line in (screen[at], *(ln for ln in screen if cells(ln)[0] == "worker")):
            assert "…" not in line, f"a header cut at 80 columns: {line!r}"
        for row in rows + consumer_rows:  # a name may be cut to fit, a number never
            assert not any("…" in cell for cell in row[1:]), row
        assert rows[0][0] == "jobs", "the busy queue comes first"
        spark = screen[at].index("1 min")
        shown_idle = [line for line in screen[at + 2:at + 2 + len(rows)] if cells(line)[0] in IDLE]
        assert len(shown_idle) == len(rows) - 1, text
        for line in shown_idle:
            assert not line[spark:].strip(), f"an idle queue's 1 min bar is not empty: {line!r}"
        folded = next((ln for ln in screen if ln.startswith("+ ")), "")
        hidden = re.match(r"\+ (\d+) idle queues?: ", folded)
        assert hidden is not None and int(hidden.group(1)) + len(shown_idle) == len(IDLE), text

        killed = time.monotonic()
        server.kill()  # SIGKILL by PID: no goodbye
        wait_until(lambda: "no answer for" in top.screen(), timeout=2.5, interval=0.02,
                   what="the header to stop saying connected (well within 3 s)")
        assert time.monotonic() - killed < 2.5
        header = top.screen().splitlines()[:4]
        assert not any(re.search(r"(?<!dis)connected", line) for line in header), header
    finally:
        stop.set()
        if top is not None:
            top.kill()
        for w in workers:
            w.stop()
        server.terminate()


def test_zq_top_once_prints_one_plain_frame(tmp_path):
    server = ServerProcess(tmp_path).start()
    try:
        with Client(server.endpoint) as c:
            c.publish_many("orders", ["x"] * 5, group="acme")
        run = subprocess.run([sys.executable, "-m", "zq.cli", "top", "--once", "--interval", "0.2", "--endpoint",
                              server.endpoint], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60)
        assert run.returncode == 0, run.stderr
        assert "orders" in run.stdout and "acme (5)" in run.stdout and "\x1b[" not in run.stdout
        # the oldest waiting message of the first queue, explained (zq explain)
        assert "oldest waiting in orders (bookmark 1): no consumer is subscribed" in run.stdout, run.stdout
    finally:
        server.terminate()


def test_a_busy_metrics_port_is_one_line_not_a_traceback(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "zq.cli", "serve", "--data", str(tmp_path / "j"), "--bind",
                              f"ipc://{tmp_path}/zq.sock", "--metrics", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, env=env(), timeout=60)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [f"zq: cannot serve metrics on 127.0.0.1:{port}: Address already in use"]


def test_metrics_are_scraped_and_parse_as_prometheus_text(tmp_path):
    port = free_port()
    server = ServerProcess(tmp_path, "--metrics", f"127.0.0.1:{port}").start()
    try:
        with Client(server.endpoint) as c:
            c.publish_many("jobs", ["a", "b", "c"])
            with c.subscribe("jobs", max_backlog=3) as sub:
                for _ in range(3):
                    sub.get(5).ack()

        def scrape() -> dict:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return {f.name: f for f in text_string_to_metric_families(body)}

        def scraped_with_acks() -> dict | None:
            families = scrape()
            return families if _acked(families) == 3 else None

        families = wait_until(scraped_with_acks, what="metrics to show 3 acks")
        depth = {s.labels["queue"]: s.value for s in families["zq_queue_depth"].samples}
        assert depth["jobs"] == 0
        hist = families["zq_ack_latency_seconds"]
        assert hist.type == "histogram"
        counts = {s.name: s.value for s in hist.samples if s.labels.get("queue") == "jobs" and s.name.endswith("_count")}
        inf = [s.value for s in hist.samples if s.labels.get("le") == "+Inf" and s.labels.get("queue") == "jobs"]
        assert counts["zq_ack_latency_seconds_count"] == 3 and inf == [3]
        assert families["zq_journal_bytes"].samples[0].value > 0
        assert families["zq_journal_sync_running_seconds"].samples[0].value >= 0
        assert families["zq_journal_sync_last_seconds"].samples[0].value >= 0
    finally:
        server.terminate()


def _acked(families: dict) -> float:
    fam = families.get("zq_acked")
    if fam is None:
        return -1
    return sum(s.value for s in fam.samples if s.labels.get("queue") == "jobs" and s.name == "zq_acked_total")


def test_a_fair_queue_exports_what_its_tenants_hold():
    from zq.core import Engine, QueueSettings
    from zq.server.metrics import queue_metrics

    eng = Engine([QueueSettings(name="jobs", tenant_header="tenant")])
    for tenant, n in (("acme", 3), ("initech", 1)):
        for _ in range(n):
            eng.publish("jobs", b"x", {"tenant": tenant}, 0)
    eng.drain(0)
    families = {f.name: f for f in queue_metrics(eng.stats())}
    held = {s.labels["tenant"]: s.value for s in families["zq_tenant_held"].samples}
    assert held == {"acme": 3, "initech": 1}
