"""A real ZooKeeper for cluster tests and the failover bench: Debian's package (3.8),
started in a temporary directory on 127.0.0.1 and a free port, stopped by its PID.

``.ci/run`` installs the ``zookeeper`` package (not ``zookeeperd``, whose install
starts a system daemon listening on every interface)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_CONF = "/etc/zookeeper/conf"  # its log4j settings; our zoo.cfg is written per run


def missing() -> str | None:
    """Why a ZooKeeper cannot be started here (None: it can)."""
    if shutil.which("java") is None:
        return "no java on PATH (Debian: openjdk-17-jre-headless)"
    if not os.path.exists(ZOOKEEPER_JAR):
        return f"no {ZOOKEEPER_JAR} (Debian: apt-get install zookeeper)"
    try:
        import kazoo  # noqa: F401
    except ImportError:
        return "kazoo is not installed"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ZooKeeper:
    """One standalone ZooKeeper; ``hosts`` is its ``host:port``."""

    def __init__(self, directory: str | Path, tick_ms: int = 500) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.hosts = f"127.0.0.1:{self.port}"
        (self.dir / "zoo.cfg").write_text(
            f"tickTime={tick_ms}\n"
            f"dataDir={self.dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "minSessionTimeout=1000\n"
            "maxSessionTimeout=60000\n"
            "admin.enableServer=false\n"
            "maxClientCnxns=200\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> "ZooKeeper":
        log = open(self.dir / "zookeeper.log", "ab")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", f"-Dzookeeper.log.dir={self.dir}", "-Dzookeeper.root.logger=WARN,CONSOLE",
             "-cp", f"{ZOOKEEPER_CONF}:{ZOOKEEPER_JAR}",
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(self.dir / "zoo.cfg")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited ({self.proc.returncode}): "
                                   f"{(self.dir / 'zookeeper.log').read_text()[-2000:]}")
            if self.answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ZooKeeper did not answer on {self.hosts} in {timeout_s:.0f}s")

    def answers(self) -> bool:
        """Does it take a session? (A connect and a ping, through kazoo.)"""
        from kazoo.client import KazooClient

        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False  # not listening yet (asked first: kazoo would log every refusal)
        quiet = logging.getLogger("kazoo.client")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # "connection dropped" while it starts is expected here
        zk = KazooClient(hosts=self.hosts, timeout=2.0)
        try:
            zk.start(timeout=1.0)
            zk.get_children("/")
            return True
        except Exception:  # noqa: BLE001 -- not up yet
            return False
        finally:
            quiet.setLevel(level)
            try:
                zk.stop()
                zk.close()
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
