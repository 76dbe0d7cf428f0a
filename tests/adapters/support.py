"""Real processes for end-to-end tests: a `zq serve`, worker processes, bounded waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.01, what: str = "condition"):
    """Poll ``predicate`` until truthy; fail clearly when ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def raw_dealer(endpoint: str):  # type: ignore[no-untyped-def]
    """A bare DEALER socket (no zq client) for speaking ZQP/1 frame by frame."""
    import zmq

    raw = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.connect(endpoint)
    return raw


def cli(*args: str) -> subprocess.CompletedProcess:
    """``zq ARGS...`` in its own process, as a user types it (bounded)."""
    return subprocess.run([sys.executable, "-m", "zq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env(), cwd=ROOT)


def raw_session(endpoint: str, name: str = "raw", **options: int):  # type: ignore[no-untyped-def]
    """A bare DEALER that said HELLO and got WELCOME (frames by hand, as a hostile peer);
    ``options``: socket options set before it connects (``RCVHWM=1``, ...)."""
    import zmq

    from zq import wire

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in options.items():
        sock.setsockopt(getattr(zmq, option), value)
    sock.connect(endpoint)
    sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, name)))
    # (Heartbeats may come first: a cluster node that has just won keeps a HELLO, and
    # heartbeats its sender, until its dispatcher takes the socket over and answers it.)
    first = answer(sock)
    assert type(first) is wire.Welcome, first
    return sock


def answer(sock) -> object:  # type: ignore[no-untyped-def]
    """The next frame ``sock`` receives that is not a heartbeat, decoded."""
    from zq import wire

    while True:
        assert sock.poll(10_000), "no answer"
        msg = wire.server_decoder.decode(sock.recv())
        if type(msg) is not wire.Heartbeat:
            return msg


def frames_for(sock, seconds: float) -> list[object]:  # type: ignore[no-untyped-def]
    """Every frame ``sock`` receives in the next ``seconds``, decoded."""
    from zq import wire

    out = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            out.append(wire.server_decoder.decode(sock.recv()))
    return out


class ServerProcess:
    """`zq serve` in its own process, on an ipc endpoint inside ``data_dir``.

    Every one started is remembered in ``started``: tests/conftest.py stops, after each
    test, those the test started and left running (a test that failed before its own
    stop), so no `zq serve` outlives the run."""

    started: list["ServerProcess"] = []

    def __init__(self, data_dir: Path, *extra: str, config: Path | None = None) -> None:
        self.data_dir = data_dir
        self.endpoint = f"ipc://{data_dir}/zq.sock"
        self.extra = list(extra)
        self.config = config
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "zq.cli", "serve", "--data", str(self.data_dir / "journal"), "--bind", self.endpoint]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        self.proc = subprocess.Popen(cmd + self.extra, env=env(), stderr=subprocess.PIPE, text=True)
        ServerProcess.started.append(self)
        from zq.client import Client

        c = Client(self.endpoint, connect_timeout=20)  # ready when it answers HELLO
        c.close()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> str:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def configured_server(tmp_path: Path, config: str):  # type: ignore[no-untyped-def]
    """A fixture body: `zq serve` with ``config`` as its zq.toml; stopped after the test,
    which fails if the server printed a traceback."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text(config)
    s = ServerProcess(tmp_path, config=cfg).start()
    yield s
    err = s.terminate()
    assert "Traceback" not in err, err


class WorkerProcess:
    """``python -m tests.adapters.worker_proc``: acks what it gets, logs it to a file."""

    def __init__(self, endpoint: str, queue: str, log: Path, backlog: int = 16, mode: str = "ack") -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.adapters.worker_proc", endpoint, queue, str(log), str(backlog), mode],
            env=env(), cwd=ROOT,
        )

    def lines(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split() for line in self.log.read_text().splitlines() if line.endswith(" done")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
