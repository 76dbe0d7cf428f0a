"""The CLI as an operator expects it: `zq stats QUEUE`, due times a person reads
(`zq peek`, `zq explain`), and a Ctrl-C that stops `zq demo` in one line. Real `zq
serve` and `zq` processes, bounded waits."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zq.cli.views import due_text, explain_text
from zq.client import Client
from zq.core.explain import duration_text

from .support import ROOT, ServerProcess, env

CLOCK = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def zq(*args: str | bytes, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zq.cli", *args], capture_output=True, text=True,
                          errors="replace", timeout=timeout, env=env(), cwd=ROOT)


def said(stderr: str) -> list[str]:
    """stderr's lines, without the notice a stale compiled core prints at every start
    (zq.build: a source edited since the build runs interpreted)."""
    return [line for line in stderr.splitlines() if "changed since it was compiled" not in line]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One `zq serve` for the module (each test names its own queues)."""
    s = ServerProcess(tmp_path_factory.mktemp("operator")).start()
    yield s
    assert "Traceback" not in s.terminate()


# --- 1. zq stats QUEUE


def test_stats_of_one_queue_shows_that_queue_only(server):
    ep = ("--endpoint", server.endpoint)
    with Client(server.endpoint) as c:
        c.publish_many("orders", ["a", "b", "c"])
        c.publish("other", "x")
    run = zq("stats", "orders", *ep)
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines()]
    assert ["orders", "3", "0", "0", "3"] in [r[:5] for r in rows] and not any(r[:1] == ["other"] for r in rows)
    doc = json.loads(zq("stats", "orders", "--json", *ep).stdout)
    assert (doc["depth"], doc["published"], doc["consumers"]) == (3, 3, [])
    everything = json.loads(zq("stats", "--json", *ep).stdout)  # without QUEUE: as before
    assert {"orders", "other"} <= set(everything["queues"])


def no_queue_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr)  # as groups / explain / purge / queue delete say it
    assert run.stdout == "" and "Traceback" not in run.stderr
    lines = said(run.stderr)
    assert len(lines) == 1 and lines[0].startswith("zq: no queue named "), run.stderr
    return lines[0]


def test_stats_of_an_unknown_queue_says_so_in_one_line(server):
    for extra in ((), ("--json",)):
        line = no_queue_line(zq("stats", "ordres", *extra, "--endpoint", server.endpoint))
        assert "'ordres'" in line and "zq queue list" in line


@pytest.mark.parametrize("name", [
    "x" * 100_000,  # near the longest argument Linux passes (128 KiB)
    "two\nlines\r\x1b[31mred\x07",
    "ünï/кóд*?[]{}$(rm -rf /);'\"\\",
    "-looks-like-an-option",
    b"\xff\xfe not utf-8",
    " ",
], ids=["huge", "control-characters", "unicode-and-shell", "dash", "not-utf8", "blank"])
def test_stats_of_a_strange_queue_name_is_one_bounded_line(server, name):
    args = ("--", name) if isinstance(name, str) and name.startswith("-") else (name,)
    line = no_queue_line(zq("stats", "--endpoint", server.endpoint, *args))
    assert len(line) < 200 and "\x1b" not in line and "\r" not in line
    if isinstance(name, str) and len(name) > 1000:
        assert "(100,000 characters)" in line


def test_stats_without_a_dispatcher_fails_as_before(tmp_path):
    run = zq("stats", "orders", "--endpoint", f"ipc://{tmp_path}/nobody.sock", timeout=30)
    assert run.returncode == 3 and "zq serve" in run.stderr and "Traceback" not in run.stderr


# --- 2. durations and due times for a person


def test_one_duration_formatter():
    cases = {-5: "0ms", 0: "0ms", 850: "850ms", 999: "999ms", 1_000: "1s", 12_500: "12.5s", 59_999: "59.9s",
             60_000: "1m", 3_594_522: "59m 54s", 3_600_000: "1h", 3 * 3_600_000 + 2 * 60_000 + 59_000: "3h 2m",
             86_400_000: "1d", 2 * 86_400_000 + 4 * 3_600_000 + 59 * 60_000: "2d 4h"}
    assert {ms: duration_text(ms) for ms in cases} == cases


def test_due_text_and_explain_text_say_when_in_local_time():
    due = 1_795_724_043_000
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(due / 1000))
    assert due_text(due, due - 3_594_522) == f"{local} (in 59m 54s)"
    assert due_text(due, due + 5) == f"{local} (due now)"
    doc = {"queue": "q", "bookmark": 7, "state": "waiting", "not_before_ms": due, "published_ms_ago": 2_500,
           "why": ["waits for its retry: due in 59m 54s", "no consumer is subscribed to the queue"]}
    text = explain_text(doc)
    assert f"  waits for its retry: due in 59m 54s (at {local})\n" in text
    assert "published 2.5s ago" in text and text.endswith("\n  no consumer is subscribed to the queue")


def test_peek_and_explain_show_a_delayed_message_due_time_for_a_person(server):
    ep = ("--endpoint", server.endpoint)
    pub = zq("publish", "later", "hello", "--delay", "1h", *ep)
    assert pub.returncode == 0, pub.stderr
    bookmark = int(pub.stdout)
    run = zq("peek", "later", *ep)
    assert run.returncode == 0, run.stderr
    row = json.loads(run.stdout.splitlines()[0])
    assert isinstance(row["not_before_ms"], int) and row["not_before_ms"] > time.time() * 1000 + 3_500_000
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["not_before_ms"] / 1000))
    assert re.fullmatch(rf"{local} \(in (59m \d+s|1h)\)", row["due"]), row["due"]
    assert list(row)[list(row).index("not_before_ms") + 1] == "due" and row["data"] == "hello"
    text = zq("explain", "later", str(bookmark), *ep).stdout
    assert re.search(rf"due in (59m \d+s|1h) \(at {local}\)$", text, re.M), text
    assert " ms" not in text.split("history")[0], text  # no raw milliseconds above the history
    raw = json.loads(zq("explain", "later", str(bookmark), "--json", *ep).stdout)  # --json: the numbers as they were
    assert raw["not_before_ms"] == row["not_before_ms"] and isinstance(raw["due_in_ms"], int)
    with Client(server.endpoint) as c:
        c.publish("now", "x")
    assert "due" not in json.loads(zq("peek", "now", *ep).stdout)  # nothing to wait for: nothing added


def test_peek_of_an_unknown_queue_says_so_like_the_others(server):
    no_queue_line(zq("peek", "nosuch", "--endpoint", server.endpoint))


# --- 3. Ctrl-C in zq demo


def read_line_until(proc: subprocess.Popen, text: str, timeout: float) -> list[str]:
    """stdout lines up to the first holding ``text`` (bounded; the process may end first)."""
    assert proc.stdout is not None
    deadline, lines = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no line with {text!r} within {timeout}s: {lines}")


def test_ctrl_c_stops_the_demo_in_one_line_and_cleans_up():
    """Ctrl-C at a terminal signals the whole foreground process group: the demo and its
    workers. Here the demo leads its own group, and the group gets the SIGINT."""
    proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "demo", "--messages", "5000000", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT,
                            start_new_session=True)
    try:
        lines = read_line_until(proc, "publishing", timeout=60)  # its workers are subscribed: all is running
        journal = Path(re.search(r"journal in (\S+)", lines[0]).group(1))  # type: ignore[union-attr]
        assert journal.exists()
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, (proc.returncode, err)
    assert said(err) == ["zq demo: interrupted"], err
    assert "Traceback" not in err + out and took < 30
    assert not journal.exists()  # its temporary journal is gone
    deadline = time.monotonic() + 10
    while True:  # and so are its workers (the group had only the demo's processes)
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a demo worker outlived the demo"
        time.sleep(0.05)
