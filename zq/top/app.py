"""The live loop of `zq top`: a thread fetches stats and builds the model (``Poller``); the
screen renders the latest, marked stale when the server is late to answer. Nothing else."""

from __future__ import annotations

import os
import select
import sys
import termios
import threading
import time
import tty

from rich.console import Console
from rich.live import Live

from zq.client import Client
from zq.top import model as M
from zq.top.view import render

KEYS = {"d": "depth", "r": "rate", "l": "latency", "n": "name"}


class Source:
    """Stats from the server; reconnects by itself, says why when it cannot."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.client: Client | None = None

    def fetch(self, timeout: float) -> dict:
        if self.client is None:
            self.client = Client(self.endpoint, connect_timeout=timeout, heartbeat_ms=500, liveness=2)
        try:
            return self.client.stats(timeout=timeout)
        except Exception:
            self.client.close()
            self.client = None
            raise

    def explain_oldest(self, m: M.TopModel, timeout: float = 10.0) -> None:
        """Say why the first queue's oldest waiting message waits (one explain, no history)."""
        target = M.oldest_to_explain(m)
        if target is None or self.client is None:
            return
        try:
            doc = self.client.admin("explain", timeout=timeout, queue=target[0], bookmark=target[1], history=0)
            m.oldest_why = M.why_line(target[0], doc)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 -- a dispatcher without explain, or the message left meanwhile
            m.oldest_why = None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def once(endpoint: str, interval: float, width: int = 120) -> str:
    """One frame as plain text (two snapshots ``interval`` apart, for the rates)."""
    src = Source(endpoint)
    try:
        first = src.fetch(5)
        t0 = time.monotonic()
        time.sleep(interval)
        second = src.fetch(5)
        dt = int((time.monotonic() - t0) * 1000)
        m = M.build(endpoint, first, second, dt, M.History())
        src.explain_oldest(m)
    finally:
        src.close()
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(render(m, fit_height=False))
    return console.export_text()


class Poller:
    """STATS every ``interval`` on a thread of its own, so the screen never waits for the
    server: it shows the last answer, and how long ago that was once an answer is late
    (``M.current``). Wakes the screen through a pipe after each answer or failure."""

    def __init__(self, endpoint: str, interval: float, sort: str = M.DEFAULT_SORT) -> None:
        self.src, self.interval, self.sort = Source(endpoint), interval, sort
        self.timeout = max(interval, 1.0)
        self.history = M.History()
        self.lock = threading.Lock()
        self.model: M.TopModel | None = None
        self.answered_at: float | None = None  # monotonic time of the last STATS answered
        self.asked_at: float | None = None  # of the last STATS sent
        self.error: str | None = None  # why the last one failed (until one is answered)
        self.stopping = threading.Event()
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.thread = threading.Thread(target=self._run, name="zq-top-stats", daemon=True)

    def start(self) -> "Poller":
        self.thread.start()
        return self

    def _run(self) -> None:
        prev, prev_t = None, 0.0
        try:
            while not self.stopping.is_set():
                asked = time.monotonic()
                with self.lock:
                    self.asked_at = asked
                try:
                    curr = self.src.fetch(self.timeout)
                    now = time.monotonic()
                    m = M.build(self.src.endpoint, prev, curr, int((now - prev_t) * 1000), self.history, self.sort)
                    self.src.explain_oldest(m, self.timeout)
                    prev, prev_t = curr, now
                    with self.lock:
                        self.model, self.answered_at, self.error = m, now, None
                except Exception as exc:  # noqa: BLE001 -- shown in the header; the next round retries
                    prev = None
                    with self.lock:
                        self.error = type(exc).__name__
                self._wake()
                self.stopping.wait(max(0.0, asked + self.interval - time.monotonic()))
        finally:
            self.src.close()

    def _wake(self) -> None:
        if not self.stopping.is_set():
            try:
                os.write(self.wake_w, b"x")
            except BlockingIOError:
                pass  # woken already

    def frame(self, now: float) -> M.TopModel:
        with self.lock:
            last, answered, asked, error = self.model, self.answered_at, self.asked_at, self.error
        m = M.current(self.src.endpoint, last, answered, asked, error, now, self.interval)
        return m if m.sort == self.sort else M.resorted(m, self.sort)

    def next_check(self, now: float) -> float:
        """Seconds until the frame may change by itself (a request turning late)."""
        with self.lock:
            asked, answered = self.asked_at, self.answered_at
        tick = min(self.interval, 0.5)
        if asked is not None and (answered is None or asked > answered):
            until_late = asked + M.late_after(self.interval) - now
            if until_late > 0:
                return min(tick, until_late + 0.01)
        return tick

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(self.timeout + 2)
        if not self.thread.is_alive():  # else it may still write: leave the pipe to the exit
            os.close(self.wake_r)
            os.close(self.wake_w)


def live(endpoint: str, interval: float) -> None:
    poller = Poller(endpoint, interval).start()
    keys = KeyReader()
    try:
        with keys, Live(render(M.disconnected(endpoint, None, "connecting")), screen=True, auto_refresh=False) as view:
            while True:
                now = time.monotonic()
                view.update(render(poller.frame(now)), refresh=True)
                key = keys.wait(poller.next_check(now), poller.wake_r)
                if key == "q":
                    return
                if key in KEYS:
                    poller.sort = KEYS[key]
    except KeyboardInterrupt:
        pass
    finally:
        poller.close()


class KeyReader:
    """Single keys from a terminal without Enter (no-op when stdin is not a tty)."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.saved: list | None = None

    def __enter__(self) -> "KeyReader":
        if self.fd is not None:
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def wait(self, timeout: float, wake_fd: int | None = None) -> str | None:
        """A key pressed within ``timeout``; None when it passed, or ``wake_fd`` became
        readable first (drained)."""
        fds = [fd for fd in (self.fd, wake_fd) if fd is not None]
        if not fds:
            time.sleep(timeout)  # nothing to wait on: no tty, no wake-up pipe
            return None
        ready, _, _ = select.select(fds, [], [], timeout)
        if wake_fd is not None and wake_fd in ready:
            try:
                os.read(wake_fd, 4096)
            except BlockingIOError:
                pass
        if self.fd is not None and self.fd in ready:
            return os.read(self.fd, 1).decode(errors="ignore").lower()
        return None
