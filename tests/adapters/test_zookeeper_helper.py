"""The README's ZooKeeper for a trial runs as written, with Debian's package: its shell
block (cluster section, "**ZooKeeper.**") starts a ZooKeeper that reads our zoo.cfg, not
/etc/zookeeper/conf's; it answers on 127.0.0.1 only (no JMX port, no AdminServer, nothing
on another interface), grants the 2 s session a cluster asks for by default, and the
status and stop commands the README gives work.

The block runs in a scratch directory with one change: port 2181 becomes a free port.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from zq.testing.zookeeper import free_port, missing

pytestmark = pytest.mark.slow  # a JVM start, a few seconds

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ZKSERVER = "/usr/share/zookeeper/bin/zkServer.sh"


def zookeeper_section() -> str:
    cluster = README.split("## A cluster: automatic failover", 1)[1].split("\n## ", 1)[0]
    return cluster.split("**ZooKeeper.**", 1)[1]


def start_block() -> str:
    m = re.search(r"^```sh\n(.*?)^```", zookeeper_section(), re.M | re.S)
    assert m, "the README's cluster section has no ```sh block after **ZooKeeper.**"
    return m.group(1)


def needs_zookeeper() -> None:
    why = missing() or (None if os.path.exists(ZKSERVER) else f"no {ZKSERVER} (Debian: apt-get install zookeeper)")
    if why is not None:
        if os.environ.get("ZQ_REQUIRE_ZOOKEEPER"):
            pytest.fail(f"ZooKeeper is required here (ZQ_REQUIRE_ZOOKEEPER) but {why}")
        pytest.skip(f"no ZooKeeper here: {why}")


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = fields[1].split(":")
            raw = bytes.fromhex(hexaddr)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # host-order words
            addr = socket.inet_ntop(family, raw)
            found.append((addr.removeprefix("::ffff:"), int(hexport, 16)))
    return found


def granted_session_ms(hosts: str, asked_s: float) -> int:
    """The session timeout ZooKeeper grants kazoo for ``asked_s`` (kazoo does not keep
    it: its connection's handshake is watched here)."""
    from kazoo.client import KazooClient
    from kazoo.protocol.serialization import Connect

    zk = KazooClient(hosts=hosts, timeout=asked_s)
    granted: list[int] = []
    conn = zk._connection
    invoke = conn._invoke

    def watched(timeout, request, xid=None):
        result = invoke(timeout, request, xid)
        if isinstance(request, Connect):
            granted.append(result[0].time_out)
        return result

    conn._invoke = watched
    try:
        zk.start(timeout=10)
        zk.ensure_path("/zq/readme")
        assert zk.exists("/zq/readme") is not None
    finally:
        zk.stop()
        zk.close()
    return granted[-1]


def test_the_readme_block_names_its_own_config_and_loopback():
    block = start_block()
    assert "clientPortAddress=127.0.0.1" in block and "dataDir=$PWD/zk/data" in block
    assert 'start-foreground "$PWD/zk/zoo.cfg"' in block and "JMXDISABLE=true" in block
    assert "ZOOCFGDIR" not in block  # Debian's zkEnv.sh overwrites it


def test_the_readme_zookeeper_starts_on_loopback_only(tmp_path):
    needs_zookeeper()
    port = free_port()
    block = start_block().replace("2181", str(port))
    started = subprocess.run(["bash", "-euc", block], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert started.returncode == 0, started.stderr
    pid = int((tmp_path / "zk" / "pid").read_text())
    try:
        cfg = str(tmp_path / "zk" / "zoo.cfg")
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:  # the README: "says Mode: standalone once it serves"
            status = subprocess.run([ZKSERVER, "status", cfg], capture_output=True, text=True, timeout=60)
            if "Mode: standalone" in status.stdout:
                break
            assert os.path.exists(f"/proc/{pid}"), (tmp_path / "zk" / "zookeeper.out").read_text()
            time.sleep(0.5)
        assert status is not None and "Mode: standalone" in status.stdout, (status.stdout, status.stderr)
        out = (tmp_path / "zk" / "zookeeper.out").read_text()
        assert f"Using config: {cfg}" in out, out  # ours, not /etc/zookeeper/conf/zoo.cfg
        assert (tmp_path / "zk" / "data" / "version-2").is_dir()  # its data where the file says

        # the pid the block saved is ZooKeeper's own (zkServer.sh execs java), and it
        # listens on 127.0.0.1:port and nowhere else
        assert "QuorumPeerMain" in Path(f"/proc/{pid}/cmdline").read_text()
        assert listening(pid) == [("127.0.0.1", port)], listening(pid)

        # a cluster's default session (2 s) is granted as asked (minSessionTimeout=1000)
        assert granted_session_ms(f"127.0.0.1:{port}", 2.0) == 2000
        assert granted_session_ms(f"127.0.0.1:{port}", 30.0) == 30000  # zq's longest (maxSessionTimeout)
    finally:
        # the README's stop: kill $(cat zk/pid)
        subprocess.run(["bash", "-c", "kill $(cat zk/pid)"], cwd=tmp_path, timeout=10)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}") or "zombie" in _state(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
    assert not os.path.exists(f"/proc/{pid}") or "zombie" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "zombie"  # gone
