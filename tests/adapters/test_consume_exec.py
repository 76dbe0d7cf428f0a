"""`zq consume --exec` stops like zq.Worker: a real `zq serve`, the real `zq consume`
in its own process, real shell commands.

A first SIGTERM or Ctrl-C lets the running command finish and settles it by its exit
status; a second one (or the end of --grace) cancels the command's whole process group
and its message goes back, not counted as failed; a command that cannot run stops zq
with one line instead of burning every message's deliveries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zq.client import Client

from .support import ROOT, ServerProcess, env, wait_until

slow = pytest.mark.slow  # real processes, a few seconds each (the quick tier keeps the --grace parsing)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("exec")).start()
    yield s
    err = s.terminate()
    assert "Traceback" not in err, err


class Consume:
    """`zq consume QUEUE --exec CMD ...` in a session of its own (as a shell job is: a
    terminal's Ctrl-C goes to its whole process group), its stderr read as it comes."""

    def __init__(self, server: ServerProcess, queue: str, command: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zq.cli", "consume", queue, "--exec", command, *args],
            env={**env(), "ZQ_ENDPOINT": server.endpoint}, cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def said(self, text: str, timeout: float = 15) -> None:
        wait_until(lambda: any(text in line for line in self.lines), timeout, 0.02, what=f"{text!r} in\n{self.stderr}")

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"zq consume still running after {timeout}s:\n{self.stderr}") from None
        self.reader.join(5)
        return rc

    def stop(self) -> None:  # (a test that failed midway: nothing left behind)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def consumers():
    started: list[Consume] = []
    yield started
    for c in started:
        c.stop()


def group_alive(pgid: int) -> bool:
    """Does any live (not zombie) process belong to process group ``pgid``?"""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def read_pid(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip(), 15, 0.02, what=f"{path.name} written")
    return int(path.read_text())


def queue_state(server: ServerProcess, queue: str, *bookmarks: int) -> tuple[dict, list[dict]]:
    with Client(server.endpoint) as c:
        return c.stats()["queues"][queue], [c.explain(queue, b) for b in bookmarks]


def publish(server: ServerProcess, queue: str, *payloads: str) -> list[int]:
    with Client(server.endpoint) as c:
        return c.publish_many(queue, list(payloads))


@slow
@pytest.mark.parametrize("sig", ["SIGTERM", "Ctrl-C"])
def test_a_signal_lets_the_running_command_finish_and_acks_it(server, tmp_path, consumers, sig):
    """The command in hand finishes and is acked (not redelivered: no work twice); the
    message taken but not started goes back uncounted as a failure; zq exits 0. Ctrl-C
    is a SIGINT to the whole foreground process group, as a terminal sends it: the
    command must not get it (it used to die of it and count as failed)."""
    queue = f"finish-{sig.lower()}"
    first, second = publish(server, queue, "one", "two")
    started, done = tmp_path / "started", tmp_path / "done"
    command = f'echo $$ > {started}; sleep 1.5; cat >> {done}; echo " ok" >> {done}'
    zq = Consume(server, queue, command, "--max-backlog", "2", "--grace", "20")
    consumers.append(zq)
    pgid = read_pid(started)
    wait_until(lambda: queue_state(server, queue)[0]["leased"] == 2, 10, what="both messages leased")
    if sig == "SIGTERM":
        zq.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(zq.proc.pid, signal.SIGINT)
    name = "SIGTERM" if sig == "SIGTERM" else "SIGINT"
    zq.said(f"stopping ({name}): taking no more messages; 1 message taken but not started went back to the queue; "
            "waiting up to 20s for 1 running command to finish")
    assert zq.wait(15) == 0, zq.stderr
    assert done.read_text() == "one ok\n"  # finished, once, before zq left
    assert not group_alive(pgid)
    st, (one, two) = queue_state(server, queue, first, second)
    assert (st["acked"], st["failed"], st["leased"], st["depth"]) == (1, 0, 0, 1), st
    assert one["state"] == "not-in-queue"
    assert two["state"] == "waiting" and two["causes"]["failed"] == 0, two
    assert "exited" not in zq.stderr and "Traceback" not in zq.stderr


@slow
def test_a_second_signal_cancels_the_command_group_and_returns_its_message(server, tmp_path, consumers):
    queue = "second-signal"
    (bookmark,) = publish(server, queue, "job")
    started, late, grandchild = tmp_path / "started", tmp_path / "late", tmp_path / "grandchild"
    # The command starts a child of its own (the group must go, not only the shell).
    command = f'echo $$ > {started}; (sleep 30; echo late > {late}) & echo $! > {grandchild}; wait'
    zq = Consume(server, queue, command, "--grace", "30")
    consumers.append(zq)
    pgid = read_pid(started)
    read_pid(grandchild)
    zq.proc.send_signal(signal.SIGTERM)
    zq.said("stopping (SIGTERM)")
    t0 = time.monotonic()
    os.killpg(zq.proc.pid, signal.SIGINT)  # Ctrl-C, this time
    zq.said("SIGINT again: cancelling 1 running command")
    assert zq.wait(10) == 1, zq.stderr
    assert time.monotonic() - t0 < 8  # not the grace period
    assert not group_alive(pgid), "the command's process group outlived zq"
    assert not late.exists()
    assert f"cancelled the command for bookmark {bookmark} (delivery 1): the message went back to the queue, not " \
           "counted as failed" in zq.stderr
    st, (msg,) = queue_state(server, queue, bookmark)
    assert (st["acked"], st["failed"], st["depth"], st["leased"]) == (0, 0, 1, 0), st
    assert msg["state"] == "waiting" and msg["causes"]["failed"] == 0 and msg["causes"]["cancelled"] == 1, msg


@slow
def test_the_end_of_the_grace_period_cancels_even_a_command_that_ignores_sigterm(server, tmp_path, consumers):
    queue = "grace-ends"
    (bookmark,) = publish(server, queue, "job")
    started = tmp_path / "started"
    command = f"trap '' TERM; echo $$ > {started}; sleep 30"  # SIGTERM ignored: SIGKILL it is
    zq = Consume(server, queue, command, "--grace", "0.5")
    consumers.append(zq)
    pgid = read_pid(started)
    zq.proc.send_signal(signal.SIGTERM)
    assert zq.wait(15) == 1, zq.stderr
    assert "1 command still running after the 0.5s grace period: cancelling 1 running command" in zq.stderr
    assert not group_alive(pgid)
    st, (msg,) = queue_state(server, queue, bookmark)
    assert (st["failed"], st["depth"], st["leased"]) == (0, 1, 0), st
    assert msg["state"] == "waiting" and msg["causes"]["failed"] == 0, msg


@slow
def test_a_command_that_cannot_run_stops_zq_and_burns_no_failures(server, tmp_path, consumers):
    queue = "missing"
    first, second = publish(server, queue, "a", "b")
    zq = Consume(server, queue, "./make-thumbnail.sh", "--grace", "5")
    consumers.append(zq)
    assert zq.wait(15) == 127, zq.stderr
    lines = [line for line in zq.lines if line.startswith("zq consume:")]
    assert len(lines) == 1, zq.stderr
    assert lines[0].startswith("zq consume: cannot run `./make-thumbnail.sh`: exit 127, command not found: ")
    assert "make-thumbnail.sh: not found" in lines[0]  # what the shell said
    assert f"Bookmark {first} went back to the queue (as does every message whose command could not run), " \
           "not counted as failed" in lines[0]
    st, (a, b) = queue_state(server, queue, first, second)
    assert (st["failed"], st["depth"], st["leased"], st["dead_lettered"]) == (0, 2, 0, 0), st
    assert a["state"] == "waiting" and a["deliveries"] == 1 and a["causes"]["failed"] == 0, a
    assert b["deliveries"] == 0  # never handed to a consumer that could not run it

    (tmp_path / "not-executable.sh").write_text("echo hi\n")
    zq = Consume(server, queue, str(tmp_path / "not-executable.sh"))
    consumers.append(zq)
    assert zq.wait(15) == 126, zq.stderr
    assert "exit 126, found but not executable" in zq.stderr and "Permission denied" in zq.stderr
    assert queue_state(server, queue)[0]["failed"] == 0


@slow
def test_the_last_allowed_delivery_says_it_is_dead_lettered_now(server, consumers):
    with Client(server.endpoint) as c:
        c.create_queue("last", max_deliveries=2, dead_letter="last.dead", backoff=[])  # (retries at once)
        c.publish("last", "x")
    zq = Consume(server, "last", "exit 3", "--count", "2")
    consumers.append(zq)
    assert zq.wait(20) == 0, zq.stderr
    assert "(delivery 1): cancelled; it will be delivered again, up to 2 deliveries, then dead-lettered to " \
           "'last.dead'" in zq.stderr
    assert "(delivery 2): cancelled; that was its last delivery (2 of 2): it is being dead-lettered now to " \
           "'last.dead'" in zq.stderr
    st = queue_state(server, "last")[0]
    assert (st["failed"], st["dead_lettered"], st["depth"]) == (2, 1, 0), st


@pytest.mark.parametrize("value", ["-1", "86401", "1e9", "abc", "nan", "inf", ""])
def test_a_bad_grace_is_one_line_and_exit_2(value):
    """Checked before connecting: no dispatcher is needed to be told."""
    from typer.testing import CliRunner

    from zq.cli.app import app

    run = CliRunner().invoke(app, ["consume", "q", "-e", "ipc:///nonexistent/zq.sock", "--exec", "true",
                                         "--grace", value])
    assert run.exit_code == 2, run.output
    lines = run.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zq: --grace "), run.output


@slow
def test_publish_to_puts_each_command_s_stdout_lines_in_the_ack_s_commit(server, consumers):
    """A pipeline stage in one line of shell: exit 0 publishes the command's stdout lines
    with the ack (docs/protocol.md §7.9); a failing command publishes nothing; output
    the dispatcher refuses fails the message, with why, and publishes nothing."""
    first, second, third = publish(server, "stage", "a b", "fail", "huge")
    command = ('read -r words; case "$words" in fail) echo partial; exit 3;; '
               'huge) head -c 20000000 /dev/zero | tr "\\0" x; echo;; *) for w in $words; do echo "$w"; done; printf "c\\r\\n";; esac')
    zq = Consume(server, "stage", command, "--publish-to", "stage.out", "--limit", "3", "--timeout", "5")
    consumers.append(zq)
    assert zq.wait(60) == 0, zq.stderr
    assert "the command's stdout is over 16,777,216 bytes: not published" in zq.stderr
    with Client(server.endpoint) as c:
        with c.subscribe("stage.out", max_backlog=10) as out:
            got = [out.get(5) for _ in range(3)]
            assert out.get(0.3) is None, "published more than the successful command's lines"
            assert [m.data for m in got] == [b"a", b"b", b"c"]  # (a CRLF ends a line as a LF does)
            assert [m.msg_id for m in got] == [f"zq:stage:{first}:{i}" for i in range(3)]
            out.ack_many(got, wait=True)
        st = c.stats()["queues"]["stage"]
        assert (st["acked"], st["failed"]) == (1, 2), st
        assert c.explain("stage", second)["causes"]["last_error"].endswith("exited 3")


def test_publish_to_needs_exec():
    from typer.testing import CliRunner

    from zq.cli.app import app

    run = CliRunner().invoke(app, ["consume", "q", "-e", "ipc:///nonexistent/zq.sock", "--publish-to", "out"])
    assert run.exit_code == 2 and "give --exec too" in run.output, run.output
