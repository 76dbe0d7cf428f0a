"""ZooKeeper, for an elected cluster: who leads, as which epoch, and who is in sync.

Why ZooKeeper and these recipes
-------------------------------
zq has no consensus code of its own. ZooKeeper (through kazoo) holds three things
under the cluster's path:

* ``election``: kazoo's ``Lock``. Its holder may lead; its ephemeral node goes when
  the holder's session ends (a crash: after ``session_timeout``).
* ``state``: ``{epoch, leader, endpoint, isr}``, persistent. Only the lock's holder
  writes it, and only with a compare-and-set on the version it read
  (``transaction().check()``), so a leader whose session is gone cannot overwrite a
  newer one. ``epoch`` only grows; ``isr`` (Kafka's in-sync replicas) names the
  nodes that hold every confirmed record: only they may take over.
* ``nodes/<node>``: ephemeral, each live node's endpoint (for ``zq stats`` and for
  clients that look the cluster up).
* ``proofs/<node>``: ephemeral, created with ``nodes/<node>`` in one transaction: a
  random token the node made when it started. Its standby shows it in every BOUNDS; the
  leader counts a standby's position (for confirmations and for ``isr``) only when
  ZooKeeper lists that node and holds that token for it (``proven``). A client that
  merely names a node is not that node.

Only ZooKeeper deposes a leader: a standby naming a newer epoch makes the leader read
``state`` (``check_epoch``); it steps down only if the epoch there moved.

The lease
---------
A leader must stop confirming and delivering once another may have taken over. Kazoo
reports SUSPENDED when its connection drops and LOST when the session expired, but a
process paused (SIGSTOP, a long GC, a swapped-out VM) learns neither until it runs
again, and then races its own threads. So the leader also holds a lease: every
successful round trip to ZooKeeper proves the session alive when it was sent, and
ZooKeeper expires a session only after ``session_timeout`` without hearing from it; the
leader serves until ``sent + 0.75 x session_timeout`` and renews every quarter of it.
A paused leader wakes with its lease long past and serves nothing more.
(ZooKeeper must grant the timeout asked for: its maxSessionTimeout, 20 ticks by
default, is above the 30 s zq allows.)
"""

from __future__ import annotations

import hmac
import logging
import queue
import secrets
import threading
import time
from typing import Any, Callable

import msgspec

from zq.core.errors import ZqError

log = logging.getLogger("zq.election")

# kazoo (ZooKeeper's client) is the optional extra zq[cluster]: only a cluster loads it.
KAZOO_MISSING = "zq's cluster needs kazoo (ZooKeeper's client), which is not installed: pip install 'zq[cluster]'"


def require_kazoo() -> None:
    """Raise a clear ``ModuleNotFoundError`` naming the extra when kazoo is not installed."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        raise ModuleNotFoundError(KAZOO_MISSING, name="kazoo") from None

LEASE_FRACTION = 0.75  # of the session timeout: how long one round trip lets a leader serve
PROOF_READ_INTERVAL_S = 0.5  # a node's proof is read from ZooKeeper at most this often (a mismatch asks again)
EPOCH_CHECK_INTERVAL_S = 0.25  # a claimed newer epoch is checked against ZooKeeper at most this often
REFUTED_LOG_INTERVAL_S = 10.0  # "ZooKeeper still has epoch N" is logged at most this often


class ElectionError(ZqError):
    code = "election"


class ClusterState(msgspec.Struct, kw_only=True):
    """The ``state`` znode: who leads, as which epoch, who is in sync."""

    epoch: int = 0
    leader: str = ""
    endpoint: str = ""
    isr: list[str] = msgspec.field(default_factory=list)


_state_decoder = msgspec.json.Decoder(ClusterState)


def decode_state(raw: bytes | None) -> ClusterState | None:
    if not raw:
        return None
    try:
        return _state_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        log.error("cluster state unreadable (%s): treated as none", exc)
        return None


def watch_granted_timeout(zk: Any, granted: Callable[[int], None]) -> None:
    """Call ``granted(ms)`` with the session timeout ZooKeeper grants at each connect.
    kazoo sends its ``timeout`` as the ask but keeps no record of the answer (2.11 logs
    it at BLATHER only), so its connection's handshake is wrapped here."""
    from kazoo.protocol.serialization import Connect

    conn: Any = getattr(zk, "_connection", None)
    invoke = getattr(conn, "_invoke", None)
    if invoke is None:  # a kazoo laid out otherwise: not checked, and said so
        log.warning("this kazoo does not show the session timeout ZooKeeper grants: not checked")
        return

    def connect_watched(timeout: float, request: Any, xid: int | None = None) -> Any:
        result = invoke(timeout, request, xid)
        if isinstance(request, Connect) and isinstance(result, tuple):
            granted(int(result[0].time_out))
        return result

    conn._invoke = connect_watched


class Coordinator:
    """One node's link to ZooKeeper: its membership, the lock, the state and the lease.
    ``on_change`` is called (from kazoo's thread) when the state znode or the session
    changes; the node reads ``state``/``suspended``/``lost`` then."""

    def __init__(self, hosts: str, path: str, node: str, endpoint: str, session_timeout_ms: int,
                 on_change: Callable[[], None] = lambda: None) -> None:
        require_kazoo()  # the cluster's one dependency (zq[cluster]), loaded only by clusters
        from kazoo.client import KazooClient

        self.hosts, self.path, self.node, self.endpoint = hosts, path, node, endpoint
        self.registered = False  # our member znode exists (see register)
        self.session_timeout_s = session_timeout_ms / 1000
        self.on_change = on_change
        self.zk = KazooClient(hosts=hosts, timeout=self.session_timeout_s)
        self.asked_ms = session_timeout_ms
        self.granted_ms = 0  # the session timeout ZooKeeper granted at the last connect (0: none yet)
        watch_granted_timeout(self.zk, self.session_granted)
        self.state: ClusterState | None = None
        self.alive: set[str] = set()  # the nodes with a live session (their member znodes)
        self.suspended = False
        self.lost = False  # the session expired: every lock and ephemeral node of ours is gone
        self.lease_until = 0.0  # monotonic: a leader serves before this
        self.lock: Any = None  # kazoo's Lock recipe, while contending or leading
        self.jobs: queue.Queue = queue.Queue()  # compare-and-sets the leader asks for (renewer thread)
        self.stopping = threading.Event()
        self.renewer: threading.Thread | None = None
        # This node's proof (``proofs/<node>``), and the leader's cache of the others'.
        self.token = secrets.token_hex(16)
        self.proofs: dict[str, bytes] = {}  # node -> its token, as ZooKeeper last had it
        self.proof_asked: dict[str, float] = {}  # node -> when its proof was last read (monotonic)
        self.proof_reading: set[str] = set()
        self.guard = threading.Lock()  # (the loop thread asks, the renewer thread reads ZooKeeper)
        self.epoch_checking = False
        self.epoch_check_after = 0.0
        self.refuted = 0  # claimed newer epochs ZooKeeper did not confirm
        self.refuted_logged_at = -REFUTED_LOG_INTERVAL_S

    # ------------------------------------------------------------ session

    def start(self, wait_s: float = 30.0) -> None:
        from kazoo.exceptions import NodeExistsError
        from kazoo.handlers.threading import KazooTimeoutError

        self.zk.add_listener(self.session_changed)
        try:
            self.zk.start(timeout=wait_s)
        except KazooTimeoutError:
            self.zk.stop()
            raise ElectionError(f"cannot reach ZooKeeper at {self.hosts} in {wait_s:.0f}s") from None
        self.zk.ensure_path(f"{self.path}/nodes")
        self.zk.ensure_path(f"{self.path}/proofs")
        try:
            self.zk.create(f"{self.path}/state", b"", makepath=True)
        except NodeExistsError:
            pass
        self.register()
        self.zk.DataWatch(f"{self.path}/state", self.state_changed)
        self.zk.ChildrenWatch(f"{self.path}/nodes", self.members_changed)
        self.renewer = threading.Thread(target=self.renew_loop, name="zq-zookeeper-lease", daemon=True)
        self.renewer.start()

    def register(self) -> None:
        """Our ephemeral member node and proof, in one transaction (again after a lost
        session). A node started again right after a crash finds its previous session's
        nodes still there until that session expires: the renewer tries again until
        they are ours."""
        from kazoo.exceptions import NoNodeError

        member, proof = f"{self.path}/nodes/{self.node}", f"{self.path}/proofs/{self.node}"
        tx = self.zk.transaction()
        tx.create(member, msgspec.json.encode({"endpoint": self.endpoint}), ephemeral=True)
        tx.create(proof, self.token.encode(), ephemeral=True)
        if not any(isinstance(r, Exception) for r in tx.commit()):
            self.registered = True
        else:  # a previous session of ours, not yet expired; or a duplicate node name; or ours already
            try:
                _, member_stat = self.zk.get(member)
                token, proof_stat = self.zk.get(proof)
            except NoNodeError:
                return  # gone meanwhile: the next try creates them
            mine = self.zk.client_id[0]
            self.registered = member_stat.ephemeralOwner == mine == proof_stat.ephemeralOwner and \
                token == self.token.encode()
            if not self.registered:
                log.warning("a node named %r is in the cluster already (our previous session, until it "
                            "expires, or another node with this name): trying again", self.node)

    def session_granted(self, granted_ms: int) -> None:
        """ZooKeeper's answer to our session request (kazoo's connection thread, before
        CONNECTED is reported). It clamps the ask to its [minSessionTimeout,
        maxSessionTimeout]: longer, failover is slower than configured; shorter, the
        lease must follow it, or a paused leader could serve past its session."""
        if granted_ms == self.granted_ms:
            return  # (every reconnect of the same session answers the same)
        self.granted_ms = granted_ms
        if granted_ms > self.asked_ms:
            log.warning("ZooKeeper at %s granted a %d ms session, not the %d ms asked (cluster.session_timeout): a "
                        "silent leader is replaced only after %d ms. Give ZooKeeper minSessionTimeout=%d (its default "
                        "is 2 ticks) in its zoo.cfg", self.hosts, granted_ms, self.asked_ms, granted_ms, self.asked_ms)
        elif granted_ms < self.asked_ms:
            log.error("ZooKeeper at %s granted a %d ms session, shorter than the %d ms asked "
                      "(cluster.session_timeout): the leader's lease follows it. Give ZooKeeper maxSessionTimeout=%d "
                      "(its default is 20 ticks) in its zoo.cfg", self.hosts, granted_ms, self.asked_ms, self.asked_ms)
        self.session_timeout_s = min(granted_ms, self.asked_ms) / 1000

    def session_changed(self, state: str) -> None:
        from kazoo.protocol.states import KazooState

        if state == KazooState.SUSPENDED:
            self.suspended = True
        elif state == KazooState.LOST:
            self.suspended, self.lost, self.registered = True, True, False
            self.lease_until = 0.0
        else:  # CONNECTED: the same session (SUSPENDED ended), or a new one after LOST
            self.suspended = False
        self.on_change()

    def state_changed(self, data: bytes | None, stat) -> None:  # type: ignore[no-untyped-def]
        self.state = decode_state(data)
        self.on_change()

    def members_changed(self, children: list[str]) -> None:
        self.alive = set(children)
        for gone in set(self.proofs) - self.alive:  # a node whose session ended proves nothing more
            self.proofs.pop(gone, None)
        self.on_change()

    def stop(self) -> None:
        self.stopping.set()
        if self.renewer is not None:
            self.jobs.put(None)
            self.renewer.join(5)
        try:
            self.zk.stop()
            self.zk.close()
        except Exception as exc:  # noqa: BLE001 -- closing: nothing left to do with a failure
            log.debug("zookeeper close: %s", exc)

    # ------------------------------------------------------------ the lease

    def serving(self) -> bool:
        """May the leader confirm, deliver and take acks now?"""
        return not self.suspended and time.monotonic() < self.lease_until

    def renew_loop(self) -> None:
        """Renew the lease every quarter session; run the leader's compare-and-sets."""
        period = self.session_timeout_s / 4
        while not self.stopping.is_set():
            try:
                job = self.jobs.get(timeout=period)
            except queue.Empty:
                job = None
            if self.stopping.is_set():
                return
            if job is not None:
                job()
            self.renew()
            if not self.registered and not self.lost and not self.suspended:
                try:
                    self.register()
                except Exception as exc:  # noqa: BLE001 -- ZooKeeper away: the next period tries again
                    log.debug("register: %s", exc)

    def renew(self) -> bool:
        if self.lost or self.suspended:
            return False
        sent = time.monotonic()
        try:
            self.zk.exists(f"{self.path}/state")
        except Exception as exc:  # noqa: BLE001 -- any failure: the lease is not renewed
            log.debug("lease not renewed: %s", exc)
            return False
        if not self.lost and not self.suspended:
            self.lease_until = max(self.lease_until, sent + LEASE_FRACTION * self.session_timeout_s)
        return True

    # ------------------------------------------------------------ proofs and claims

    def proven(self, node: str, token: str) -> bool:
        """Is ``token`` what ZooKeeper holds for ``node``, a node it lists? (The leader's
        loop thread: never waits. Unknown or different: the proof is read again, at most
        every PROOF_READ_INTERVAL_S, in the renewer thread; until then, not proven.)"""
        if not token or node == self.node or node not in self.alive:
            return False
        known = self.proofs.get(node)
        if known is not None and hmac.compare_digest(known, token.encode()):
            return True
        self.read_proof_soon(node)
        return False

    def read_proof_soon(self, node: str) -> None:
        now = time.monotonic()
        with self.guard:
            if node in self.proof_reading or now - self.proof_asked.get(node, -1e9) < PROOF_READ_INTERVAL_S:
                return
            self.proof_reading.add(node)
            self.proof_asked[node] = now
        self.jobs.put(lambda: self.read_proof(node))

    def read_proof(self, node: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            token, _ = self.zk.get(f"{self.path}/proofs/{node}")
            if node in self.alive:
                self.proofs[node] = token
        except NoNodeError:
            self.proofs.pop(node, None)
        except Exception as exc:  # noqa: BLE001 -- ZooKeeper away: not proven, asked again later
            log.debug("proof of %s not read: %s", node, exc)
        finally:
            with self.guard:
                self.proof_reading.discard(node)
                self.proof_asked[node] = time.monotonic()

    def read_proofs_soon(self) -> None:
        """A new leader: read every listed node's proof before their standbys report."""
        for node in sorted(self.alive - {self.node}):
            self.read_proof_soon(node)

    def check_epoch(self, mine: int, claimed: int, on_newer: Callable[[], None]) -> None:
        """Someone says epoch ``claimed`` exists (this leader's is ``mine``): read the
        state (in the renewer thread, one read at a time, at most every
        EPOCH_CHECK_INTERVAL_S) and call ``on_newer`` only if ZooKeeper's epoch moved."""
        now = time.monotonic()
        with self.guard:
            if self.epoch_checking or now < self.epoch_check_after:
                return
            self.epoch_checking = True

        def job() -> None:
            try:
                raw, _ = self.zk.get(f"{self.path}/state")
                current = decode_state(raw)
                if current is not None and current.epoch > mine:
                    log.warning("told of epoch %d: ZooKeeper has epoch %d (leader %s), newer than this leader's %d",
                                claimed, current.epoch, current.leader, mine)
                    on_newer()
                else:
                    self.refuted += 1
                    at = time.monotonic()
                    if at - self.refuted_logged_at >= REFUTED_LOG_INTERVAL_S:
                        self.refuted_logged_at = at
                        log.warning("a BOUNDS named epoch %d: ZooKeeper still has epoch %d, this leader goes on "
                                    "(%d such claims refuted so far)", claimed,
                                    current.epoch if current is not None else 0, self.refuted)
            except Exception as exc:  # noqa: BLE001 -- not known: the lease and the state's watch decide
                log.warning("a claimed epoch %d not checked with ZooKeeper: %s", claimed, exc)
            finally:
                with self.guard:
                    self.epoch_checking = False
                    self.epoch_check_after = time.monotonic() + EPOCH_CHECK_INTERVAL_S

        self.jobs.put(job)

    # ------------------------------------------------------------ the lock

    def try_lead(self, eligible: Callable[[ClusterState | None], bool], latest_epoch: int,
                 wait_s: float = 1.0) -> ClusterState | None:
        """Take the lock (waiting up to ``wait_s``) and, if ``eligible``, write a new
        epoch with a compare-and-set. Returns the new state (the lock kept), or None (the
        lock not held: someone else leads, or this node may not)."""
        from kazoo.exceptions import LockTimeout

        if self.lock is None:
            self.lock = self.zk.Lock(f"{self.path}/election", self.node)
        try:
            got = self.lock.acquire(timeout=wait_s)
        except LockTimeout:
            got = False
        if not got:
            return None
        sent = time.monotonic()
        raw, stat = self.zk.get(f"{self.path}/state")
        current = decode_state(raw)
        if not eligible(current):
            self.release()
            return None
        old_isr = current.isr if current is not None else []
        new = ClusterState(epoch=max(current.epoch if current else 0, latest_epoch) + 1, leader=self.node,
                           endpoint=self.endpoint,
                           isr=[self.node] + [n for n in old_isr if n not in (self.node, current.leader if current else "")])
        tx = self.zk.transaction()
        tx.check(f"{self.path}/state", stat.version)
        tx.set_data(f"{self.path}/state", msgspec.json.encode(new))
        results = tx.commit()
        if any(isinstance(r, Exception) for r in results):  # (BadVersionError: someone wrote it since)
            log.info("election: the state changed under us (%s); not leading", results)
            self.release()
            return None
        self.lease_until = sent + LEASE_FRACTION * self.session_timeout_s
        self.state = new
        return new

    def release(self) -> None:
        lock, self.lock = self.lock, None
        if lock is not None:
            try:
                lock.release()
            except Exception as exc:  # noqa: BLE001 -- a lost session released it already
                log.debug("lock release: %s", exc)

    def after_lost(self) -> None:
        """A new session after LOST: the old lock and member node are gone; join again."""
        self.lock = None
        self.lost = False
        self.registered = False
        self.register()

    # ------------------------------------------------------------ the in-sync set

    def set_isr(self, isr: list[str], epoch: int, done: Callable[[bool], None]) -> None:
        """Ask (from the loop thread) for the in-sync set to become ``isr``; ``done(ok)``
        is called from the renewer thread. Refused if the state is not this epoch's."""
        def job() -> None:
            ok = False
            try:
                raw, stat = self.zk.get(f"{self.path}/state")
                current = decode_state(raw)
                if current is not None and current.epoch == epoch and current.leader == self.node:
                    new = msgspec.structs.replace(current, isr=isr)
                    tx = self.zk.transaction()
                    tx.check(f"{self.path}/state", stat.version)
                    tx.set_data(f"{self.path}/state", msgspec.json.encode(new))
                    ok = not any(isinstance(r, Exception) for r in tx.commit())
            except Exception as exc:  # noqa: BLE001 -- not changed: the leader keeps waiting on the old set
                log.warning("in-sync set not changed: %s", exc)
            done(ok)

        self.jobs.put(job)
