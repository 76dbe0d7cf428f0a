"""The live loop of `zq top`: fetch stats, build the model, render. Nothing else."""

from __future__ import annotations

import os
import select
import sys
import termios
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

    def explain_oldest(self, m: M.TopModel) -> None:
        """Say why the first queue's oldest waiting message waits (one explain, no history)."""
        target = M.oldest_to_explain(m)
        if target is None or self.client is None:
            return
        try:
            m.oldest_why = M.why_line(target[0], self.client.explain(*target, history=0))
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
    console.print(render(m))
    return console.export_text()


def live(endpoint: str, interval: float) -> None:
    src, history = Source(endpoint), M.History()
    prev, prev_t, last, sort = None, 0.0, None, "depth"
    keys = KeyReader()
    try:
        with keys, Live(render(M.disconnected(endpoint, None, "connecting")), screen=True, auto_refresh=False) as view:
            while True:
                try:
                    curr = src.fetch(max(interval, 1.0))
                    now = time.monotonic()
                    last = M.build(endpoint, prev, curr, int((now - prev_t) * 1000), history, sort)
                    src.explain_oldest(last)
                    prev, prev_t = curr, now
                except Exception as exc:
                    last = M.disconnected(endpoint, last, type(exc).__name__)
                    prev = None
                view.update(render(last), refresh=True)
                key = keys.wait(interval)
                if key == "q":
                    return
                if key in KEYS:
                    sort = KEYS[key]
    except KeyboardInterrupt:
        pass
    finally:
        src.close()


class KeyReader:
    """Single keys from a terminal without Enter (no-op when stdin is not a tty)."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.saved = None

    def __enter__(self) -> "KeyReader":
        if self.fd is not None:
            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self.saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def wait(self, timeout: float) -> str | None:
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 1).decode(errors="ignore").lower() if ready else None
