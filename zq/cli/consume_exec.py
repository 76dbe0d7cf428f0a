"""``zq consume --exec CMD``: run a shell command per message, and stop without doing
work twice.

Each message runs ``CMD`` (``sh -c``) with the payload on stdin and ``ZQ_BOOKMARK``,
``ZQ_TOPIC``, ``ZQ_DELIVERIES``, ``ZQ_GROUP`` in its environment; exit 0 acks it, any
other status cancels it as *failed* (``max_failures``; its dead letter carries why).
With ``--publish-to TOPIC`` the command's stdout lines are published to TOPIC in the
same commit as the ack (docs/protocol.md §7.9): a pipeline stage in one line of shell.

Stopping is ``zq.Worker``'s (examples/worker_fleet.py): the first SIGTERM or SIGINT
stops taking messages and lets the running commands finish, each settled by its exit
status, for up to ``--grace`` seconds; a second signal, or the end of the grace period,
cancels them. Each command runs in a session (process group) of its own, so a Ctrl-C at
the terminal reaches zq alone (it used to kill every command, each then counted as a
failure), and a cancel signals the command's whole group (SIGTERM, then SIGKILL after
``KILL_AFTER_S``): nothing is left running orphaned, to do its work a second time while
the message goes to someone else.

A command that cannot run at all (the shell's exit 127, "not found", or 126, "found but
not executable") is not the message's failure: its message goes back, zq stops taking
work and exits with that status (as ``xargs``, ``env`` and ``timeout`` do) after one
line naming the command and what the shell said.

Giving a message back "uncounted" is not in the protocol (a RELEASE is only taken for a
delivery the dispatcher asked back, docs/protocol.md §7.6, so that no client can hand
back work uncounted). The closest honest settle is used: a plain CANCEL with no error
and no delay. It is never a *failure* (``max_failures``); it counts as a cancel
(``max_cancels``) and, as every delivery does, toward ``max_deliveries``. Before giving
anything back, zq changes its subscription's filter to ``FALSE`` (``admin replace``:
leases kept), so the dispatcher hands it no more messages, and none it gave back: no
delivery is spent on a consumer that is leaving. Where that is refused (a key without
the ``replace`` right), nothing is cancelled: closing the subscription returns the
messages (counted as *consumer gone*), as a worker's BYE does.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

import typer

from zq.cli.common import RET_ERROR, RET_OK, RET_USAGE, fail
from zq.core.errors import ZqError

GRACE_DEFAULT_S = 30.0
GRACE_MAX_S = 86_400.0  # a day: longer is a typo, not a plan
KILL_AFTER_S = 3.0  # a cancelled command's group gets SIGTERM, then SIGKILL this much later
CANNOT_RUN = {126: "found but not executable", 127: "command not found"}  # the shell's exit statuses
TICK_S = 0.1  # the longest the main thread waits before it looks at signals again
STDERR_TAIL = 2048  # bytes of a command's stderr kept, for the line about a command that cannot run
OUTPUT_BYTES_MAX = 16 * 1024 * 1024  # --publish-to: a command's stdout kept for publishing (beyond: it fails)
STDOUT_AFTER_EXIT_S = 10.0  # --publish-to: how long stdout may stay open after the command exits
NOTHING = "FALSE"  # a filter no message matches: the dispatcher hands this subscription nothing more


def parse_grace(text: str) -> float:
    """``--grace`` as seconds: a finite number from 0 to ``GRACE_MAX_S``; else one line, exit 2."""
    try:
        value = float(text)
    except ValueError:
        raise fail(f"--grace takes a number of seconds, e.g. 30; got {text[:40]!r}", RET_USAGE) from None
    if not math.isfinite(value) or value < 0 or value > GRACE_MAX_S:
        raise fail(f"--grace must be 0 to {GRACE_MAX_S:g} seconds, got {text[:40]!r}", RET_USAGE)
    return value


def retry_note(settings: dict) -> str:
    """What happens to a message whose command failed, from the queue's settings."""
    limit = settings.get("max_deliveries") or 0
    dead = settings.get("dead_letter")
    steps = settings.get("backoff_ms") or []
    when = "again"
    if steps:
        shown = ", ".join(f"{ms / 1000:g}s" for ms in steps[:4]) + (", ..." if len(steps) > 4 else "")
        when = f"again after the queue's backoff ({shown})"
    failures = settings.get("max_failures") or 0
    also = f" (or {failures} failed runs)" if failures else ""
    if not limit:
        if failures:
            return f"it will be delivered {when}, up to {failures} failed runs, then dead-lettered {dead_letter_to(dead)}"
        return f"it will be delivered {when} (no delivery limit on this queue)"
    return f"it will be delivered {when}, up to {limit} deliveries{also}, then dead-lettered {dead_letter_to(dead)}"


def dead_letter_to(dead: str | None) -> str:
    return f"to {dead!r}" if dead else "(dropped: the queue has no dead_letter)"


def failure_note(settings: dict, deliveries: int) -> str:
    """``retry_note``, or, for the last delivery ``max_deliveries`` allows, that the
    message is being dead-lettered now (the cancel that said so has just been applied)."""
    limit = settings.get("max_deliveries") or 0
    if limit and deliveries >= limit:
        dead = settings.get("dead_letter")
        now = f"it is being dead-lettered now to {dead!r}" if dead else \
            "it is being dropped now (the queue has no dead_letter)"
        return f"that was its last delivery ({deliveries} of {limit}): {now}"
    return retry_note(settings)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # gone already (PermissionError: a zombie leader on some systems)
        pass


def tee(src: BinaryIO, tail: bytearray) -> None:
    """Copy a command's stderr to ours as it comes, keeping its last bytes."""
    out = sys.stderr.buffer
    try:
        while chunk := src.read1(65536):  # type: ignore[attr-defined]
            tail += chunk
            del tail[:-STDERR_TAIL]
            try:
                sys.stderr.flush()
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):  # our stderr is closed: keep draining the pipe
                pass
    except (OSError, ValueError):
        pass
    finally:
        src.close()


def last_line(tail: bytes) -> str:
    lines = [line.strip() for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def say(text: str) -> None:
    typer.echo(f"zq consume: {text}", err=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class ExecRun:
    """One ``zq consume --exec`` run: the main thread takes messages and watches the
    signals; a thread per message runs its command and settles it."""

    def __init__(self, sub: Any, command: str, concurrency: int, settings: dict, grace: float,
                 publish_to: str | None = None) -> None:
        self.sub = sub
        self.publish_to = publish_to  # the command's stdout lines go there, in the ack's commit
        self.command = command
        self.shown = command if len(command) <= 80 else command[:77] + "..."
        self.settings = settings
        self.grace = grace
        self.slots = threading.Semaphore(concurrency)
        self.lock = threading.Condition()
        self.running: dict[int, subprocess.Popen] = {}  # pid (= its process group) -> command
        self.threads: set[threading.Thread] = set()
        self.killed: set[int] = set()  # process groups cancelled: their messages go back
        self.cancelling = False
        self.kill_at: float | None = None  # when the cancelled groups get SIGKILL
        self.signals: list[int] = []  # received, in order (the handler only appends)
        self.broken: tuple[int, str] | None = None  # (exit status, what it means) of a command that cannot run
        self.intake: bool | None = None  # None: taking messages; True: the dispatcher sends no more; False: it was refused
        self.intake_lock = threading.Lock()

    # ------------------------------------------------------------ main thread

    def run(self, count: int | None, timeout: float | None) -> int:
        handlers = self.install_handlers()
        try:
            self.take(count, timeout)
            return self.finish()
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def install_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}  # (signals reach the main thread only: a caller there decides)
        old: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, lambda signum, frame: self.signals.append(signum))
        return old

    @property
    def stopping(self) -> bool:
        return bool(self.signals) or self.broken is not None

    def take(self, count: int | None, timeout: float | None) -> None:
        """Take messages and start their commands until ``count``, an idle ``timeout``,
        a signal or a command that cannot run."""
        seen = 0
        while count is None or seen < count:
            while not self.slots.acquire(timeout=TICK_S):
                if self.stopping:
                    return
            msg = None
            idle_until = None if timeout is None else time.monotonic() + timeout
            while msg is None and not self.stopping:
                wait = TICK_S if idle_until is None else min(TICK_S, max(0.0, idle_until - time.monotonic()))
                msg = self.sub.get(wait)
                if msg is None and idle_until is not None and time.monotonic() >= idle_until:
                    break
            if msg is None or self.stopping:
                self.slots.release()
                if msg is not None:  # taken as the stop came: not started, so it goes back
                    self.give_back([msg])
                return
            thread = threading.Thread(target=self.work, args=(msg,), name=f"zq-exec-{msg.bookmark}", daemon=True)
            with self.lock:
                self.threads.add(thread)
            thread.start()
            seen += 1

    def finish(self) -> int:
        """Wait for the running commands: all of them after a normal end; after a stop,
        up to the grace period, then cancel what is left. Returns the exit status."""
        grace_ends: float | None = None
        patience = 1  # signals taken before the one that cancels: the stop's own, if a signal stopped it
        while True:
            if grace_ends is None and self.stopping:
                patience = min(len(self.signals), 1)
                grace_ends = time.monotonic() + self.grace
                self.announce_stop()
            with self.lock:
                if not self.threads and not self.lingering():
                    break
                if not self.cancelling and len(self.signals) > patience:
                    self.cancel_running(f"{signal.Signals(self.signals[-1]).name} again")
                elif not self.cancelling and grace_ends is not None and time.monotonic() >= grace_ends:
                    self.cancel_running(f"{plural(len(self.running), 'command')} still running after the "
                                        f"{self.grace:g}s grace period" if self.grace else "--grace 0")
                if self.kill_at is not None and time.monotonic() >= self.kill_at:
                    self.kill_at = None
                    for pgid in self.killed:
                        signal_group(pgid, signal.SIGKILL)
                self.lock.wait(TICK_S)
        if self.broken is not None:
            return self.broken[0]
        return RET_ERROR if self.killed else RET_OK

    def lingering(self) -> bool:
        """A cancelled command's process group still has members (what it started and
        left behind): they get SIGKILL at ``kill_at`` too, not left running orphaned."""
        if self.kill_at is None:
            return False
        for pgid in self.killed:
            try:
                os.killpg(pgid, 0)
                return True
            except (ProcessLookupError, PermissionError):
                continue
        return False

    def announce_stop(self) -> None:
        """The stop has begun: take no more, give back what was taken and not started, say so."""
        self.stop_intake()
        unstarted: list = []
        try:
            while batch := self.sub.get_many(1024, timeout=0):
                unstarted.extend(batch)
        except StopIteration:
            pass
        self.give_back(unstarted)
        with self.lock:
            running = len(self.running)
        back = f"; {plural(len(unstarted), 'message')} taken but not started went back to the queue" if unstarted else ""
        if self.signals:
            line = f"stopping ({signal.Signals(self.signals[0]).name}): taking no more messages{back}"
            if not running:
                say(f"{line}; no command was running")
                return
            if self.grace:
                it = "it: its message goes" if running == 1 else "them: their messages go"
                say(f"{line}; waiting up to {self.grace:g}s for {plural(running, 'running command')} to finish "
                    f"(another SIGTERM or Ctrl-C cancels {it} back to the queue)")
            else:
                say(line)
        elif running and self.grace:  # a command that cannot run stopped it (that line came first)
            say(f"waiting up to {self.grace:g}s for {plural(running, 'running command')} to finish{back} "
                f"(SIGTERM or Ctrl-C cancels {'it' if running == 1 else 'them'})")

    def cancel_running(self, why: str) -> None:
        """Cancel every running command: SIGTERM to its process group now, SIGKILL at
        ``kill_at``. Their messages go back (``run_command`` sees the group in ``killed``)."""
        self.cancelling = True
        pgids = list(self.running)
        if pgids:
            go = "its message goes" if len(pgids) == 1 else "their messages go"
            say(f"{why}: cancelling {plural(len(pgids), 'running command')} (SIGTERM to each one's process group, "
                f"SIGKILL after {KILL_AFTER_S:g}s); {go} back to the queue, not counted as failed")
        for pgid in pgids:
            self.killed.add(pgid)
            signal_group(pgid, signal.SIGTERM)
        self.kill_at = time.monotonic() + KILL_AFTER_S

    # ------------------------------------------------- both: settles of a stop

    def stop_intake(self) -> bool:
        """Tell the dispatcher to send this subscription nothing more (its leases stay).
        True if it did: only then is giving messages back safe from having them sent
        straight back here."""
        with self.intake_lock:
            if self.intake is None:
                try:
                    self.sub.client.admin("replace", timeout=5.0, sub=self.sub.sub_id, queue=self.sub.queue,
                                          max_backlog=self.sub.max_backlog, filter=NOTHING)
                    self.intake = True
                except (ZqError, TimeoutError):
                    self.intake = False
            return self.intake

    def give_back(self, messages: list) -> None:
        """Messages not worked on go back to the queue, not counted as failed: a plain
        cancel (it counts as a cancel and a delivery: the protocol has no uncounted
        return the client may choose). Without a stopped intake they stay held until
        the subscription closes, which returns them."""
        if not messages or not self.stop_intake():
            return
        try:
            self.sub.cancel_many(messages, delay=0)
        except (ZqError, TimeoutError):
            pass  # the session is gone: so are the leases; the messages are back already

    # ------------------------------------------------------- a message's thread

    def work(self, msg: Any) -> None:
        try:
            self.run_command(msg)
        except Exception as exc:  # the dispatcher went away mid-settle, ...: say so, go on
            say(f"bookmark {msg.bookmark}: {type(exc).__name__}: {exc}")
        finally:
            self.slots.release()
            with self.lock:
                self.threads.discard(threading.current_thread())
                self.lock.notify_all()

    def run_command(self, msg: Any) -> None:
        env = dict(os.environ, ZQ_BOOKMARK=str(msg.bookmark), ZQ_TOPIC=msg.topic,
                   ZQ_DELIVERIES=str(msg.deliveries), ZQ_GROUP=msg.group or "")
        try:
            # A session of its own: a terminal's Ctrl-C reaches zq only, and a cancel
            # reaches everything the command started (its process group).
            proc = subprocess.Popen(self.command, shell=True, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                    stdout=subprocess.PIPE if self.publish_to else None, env=env,
                                    start_new_session=True)
        except OSError as exc:
            self.cannot_run(msg, 127 if isinstance(exc, FileNotFoundError) else 126, str(exc))
            return
        tail = bytearray()
        copier = threading.Thread(target=tee, args=(proc.stderr, tail), daemon=True)
        copier.start()
        output = Captured()
        reader = None
        if self.publish_to:
            reader = threading.Thread(target=output.read, args=(proc.stdout,), daemon=True)
            reader.start()
        with self.lock:
            self.running[proc.pid] = proc
            if self.cancelling:  # started as the cancel went out: it goes too
                self.killed.add(proc.pid)
                signal_group(proc.pid, signal.SIGTERM)
        try:
            assert proc.stdin is not None
            try:
                proc.stdin.write(msg.data)
            finally:
                proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the command did not read it all: its exit status says how it went
        rc = proc.wait()
        copier.join(0.5)  # (a command's background child may hold stderr open: not waited for)
        if reader is not None:
            reader.join(STDOUT_AFTER_EXIT_S)  # (its stdout is the work: read to its end ...
            output.unfinished = reader.is_alive()  # ... unless something it left running holds it open)
        with self.lock:
            del self.running[proc.pid]
            killed = proc.pid in self.killed
        if rc == 0 and self.publish_to:
            self.ack_with_output(msg, output)
            return
        if rc == 0:  # done, even if a cancel came as it finished: the work is not to be repeated
            verdict = msg.ack(wait=True)  # a command is slow next to a round trip: ask
            if verdict == "lost":
                say(f"the command succeeded for bookmark {msg.bookmark} (delivery {msg.deliveries}) after its "
                    "lease had ended: the message was delivered again and its work will run again (a longer "
                    "lease on the queue avoids this)")
            return
        if killed:
            self.give_back([msg])
            say(f"cancelled the command for bookmark {msg.bookmark} (delivery {msg.deliveries}): the message went "
                "back to the queue, not counted as failed")
            return
        if rc in CANNOT_RUN:
            self.cannot_run(msg, rc, last_line(bytes(tail)))
            return
        msg.cancel(error=f"`{self.command[:200]}` exited {rc}")  # counted as failed; its dead letter says why
        say(f"the command exited {rc} for bookmark {msg.bookmark} (delivery {msg.deliveries}): cancelled; "
            f"{failure_note(self.settings, msg.deliveries)}")

    def ack_with_output(self, msg: Any, output: "Captured") -> None:
        """``--publish-to``: the command's stdout lines are published with the ack, in one
        commit (docs/protocol.md §7.9): a message is never acked without its output, and
        its output is never stored twice. Output zq cannot publish (too much, a line
        over the size limit, a refused topic) fails the message instead, with why."""
        assert self.publish_to is not None
        if output.unfinished:
            msg.cancel(error=f"`{self.command[:200]}` exited but its stdout stayed open (a process it left running "
                             "holds it): its output is not known whole")
            say(f"bookmark {msg.bookmark}: the command exited, but its stdout was still open {STDOUT_AFTER_EXIT_S:g}s "
                f"later (a background process holds it): nothing published, cancelled as failed; "
                f"{failure_note(self.settings, msg.deliveries)}")
            return
        if output.over:
            msg.cancel(error=f"`{self.command[:200]}` wrote more than {OUTPUT_BYTES_MAX:,} bytes to stdout")
            say(f"bookmark {msg.bookmark}: the command's stdout is over {OUTPUT_BYTES_MAX:,} bytes: not published; "
                f"cancelled as failed; {failure_note(self.settings, msg.deliveries)}")
            return
        lines = [line.removesuffix(b"\r") for line in bytes(output.data).split(b"\n")]  # (CRLF ends a line too)
        lines = [line for line in lines if line]
        try:
            verdict = msg.ack(publish=[(self.publish_to, line) for line in lines])
        except ZqError as exc:
            msg.cancel(error=f"output not published: {exc.code}: {str(exc)[:300]}")
            say(f"bookmark {msg.bookmark}: the command's output was refused ({exc.code}: {exc}); nothing published, "
                f"cancelled as failed; {failure_note(self.settings, msg.deliveries)}")
            return
        if verdict != "ok":
            say(f"the command succeeded for bookmark {msg.bookmark} (delivery {msg.deliveries}) after its lease had "
                f"ended ({verdict}): its output was not published; the message goes again and its work will run "
                "again (a longer lease on the queue avoids this)")

    def cannot_run(self, msg: Any, rc: int, said: str) -> None:
        """The command cannot run here: not the message's failure. It goes back, and
        the run stops with one line (the first such command's) and exit status ``rc``."""
        with self.lock:
            first = self.broken is None
            if first:
                self.broken = (rc, CANNOT_RUN.get(rc, "cannot start"))
        self.give_back([msg])
        if first:
            shell = f": {said}" if said else ""
            say(f"cannot run `{self.shown}`: exit {rc}, {CANNOT_RUN.get(rc, 'cannot start')}{shell}. Bookmark "
                f"{msg.bookmark} went back to the queue (as does every message whose command could not run), not counted "
                f"as failed; taking no more messages "
                f"(fix the command, then run zq consume again)")


class Captured:
    """A command's stdout, read to its end, kept up to ``OUTPUT_BYTES_MAX`` (beyond: ``over``,
    and the rest is read and dropped so the command is never blocked on a full pipe)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.over = False
        self.unfinished = False  # still open after the command exited (and STDOUT_AFTER_EXIT_S more)

    def read(self, src: BinaryIO) -> None:
        while True:
            chunk = src.read1(65536) if hasattr(src, "read1") else src.read(65536)
            if not chunk:
                return
            if len(self.data) + len(chunk) > OUTPUT_BYTES_MAX:
                self.over = True
                continue
            self.data += chunk


def run_exec(sub: Any, command: str, concurrency: int, count: int | None, timeout: float | None,
             settings: dict | None = None, grace: float = GRACE_DEFAULT_S, publish_to: str | None = None) -> int:
    """Run ``command`` per message of ``sub``; returns the exit status for ``zq consume``:
    0, 126 / 127 (a command that cannot run), or 1 (running commands were cancelled).
    ``publish_to``: each command's stdout lines are published there with its ack."""
    return ExecRun(sub, command, concurrency, settings or {}, grace, publish_to).run(count, timeout)
