"""Three (or N) `zq serve` nodes of one elected cluster on 127.0.0.1, each its own
process, for the cluster tests and the failover bench. Nodes are stopped, killed and
paused by their PIDs only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from zq.testing.zookeeper import free_port


class Cluster:
    def __init__(self, directory: Path, zookeeper: str, *, nodes: int = 3, path: str = "/zq/test",
                 settings: str = "", cluster_settings: str = "", session_timeout: str = "2s",
                 heartbeat: str = "500ms", env: dict[str, str] | None = None) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.ports = {n: free_port() for n in self.names}
        self.config = self.dir / "zq.toml"
        self.config.write_text(
            f'[server]\nheartbeat = "{heartbeat}"\n{settings}\n'
            f'[cluster]\nzookeeper = "{zookeeper}"\npath = "{path}"\nsession_timeout = "{session_timeout}"\n'
            f"{cluster_settings}\n")
        self.procs: dict[str, subprocess.Popen] = {}
        self.zookeeper, self.path = zookeeper, path
        self.env = env or {}  # added to each node's environment (e.g. ZQ_KEY: its standby's client key)

    def endpoint(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name]}"

    @property
    def endpoints(self) -> str:
        """Every node's endpoint, comma-separated: what clients are given."""
        return ",".join(self.endpoint(n) for n in self.names)

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def data(self, name: str) -> Path:
        return self.dir / name

    def start(self, *names: str) -> "Cluster":
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        for name in names or self.names:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "zq.cli", "serve", "--config", str(self.config), "--node", name,
                 "--data", str(self.data(name)), "--bind", self.endpoint(name)],
                stdout=subprocess.DEVNULL, stderr=open(self.log(name), "ab"), env=env)
        return self

    def state(self) -> dict[str, Any] | None:
        """The cluster's state znode, read straight from ZooKeeper."""
        import msgspec
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError

        zk = KazooClient(hosts=self.zookeeper, timeout=5.0)
        zk.start(timeout=10)
        try:
            raw, _ = zk.get(f"{self.path}/state")
            return msgspec.json.decode(raw) if raw else None
        except NoNodeError:  # no node has started yet
            return None
        finally:
            zk.stop()
            zk.close()

    def leader(self, timeout: float = 30.0, other_than: str | None = None, epoch_above: int = 0) -> tuple[str, int]:
        """The leading node's name and epoch, once there is one (and it is not ``other_than``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state()
            if st and st.get("leader") and st["leader"] != other_than and st["epoch"] > epoch_above:
                return st["leader"], st["epoch"]
            time.sleep(0.05)
        raise AssertionError(f"no leader within {timeout}s; logs:\n{self.tails()}")

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, name: str) -> int:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused one must run to stop
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            return -9

    def exited(self, name: str, timeout: float = 30.0) -> int:
        """Wait for a node told to stop to exit by itself; its exit code."""
        proc = self.procs.pop(name)
        return proc.wait(timeout)

    def close(self) -> dict[str, int]:
        """Stop every node; their exit codes."""
        return {name: self.stop(name) for name in list(self.procs)}

    def tails(self, lines: int = 15) -> str:
        out = []
        for name in self.names:
            p = self.log(name)
            text = p.read_text(errors="replace").splitlines()[-lines:] if p.exists() else []
            out.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(out)

    def tracebacks(self) -> str:
        return "\n".join(self.log(n).read_text(errors="replace") for n in self.names
                         if self.log(n).exists() and "Traceback" in self.log(n).read_text(errors="replace"))
