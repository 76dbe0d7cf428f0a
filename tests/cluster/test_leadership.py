"""The leader's duties, step by step (zq.server.leadership): which standbys are in sync,
what a replicated confirmation waits for, when the leader may serve. ZooKeeper's side
is a recorder here (``Recorder``: it takes the compare-and-sets and answers them when
the test says); the real one is exercised in test_failover.py."""

from __future__ import annotations

from zq.server.config import Config
from zq.server.election import ClusterState
from zq.server.leadership import LeaderDuty
from zq.server.sessions import Peer


class Recorder:
    """What LeaderDuty asks of ZooKeeper, answered by the test."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[str], int, object]] = []
        self.lease = True
        self.state: ClusterState | None = None
        self.proofs_read = False
        self.epoch_checks: list[tuple[int, int, object]] = []

    def serving(self) -> bool:
        return self.lease

    def set_isr(self, isr, epoch, done) -> None:  # type: ignore[no-untyped-def]
        self.asked.append((isr, epoch, done))

    def answer(self, ok: bool) -> list[str]:
        isr, _, done = self.asked.pop(0)
        done(ok)
        return isr

    def read_proofs_soon(self) -> None:
        self.proofs_read = True

    def proven(self, node: str, token: str) -> bool:
        return token == f"token of {node}"

    def check_epoch(self, mine: int, claimed: int, on_newer) -> None:  # type: ignore[no-untyped-def]
        self.epoch_checks.append((mine, claimed, on_newer))


def duty(replicas_ack: int = 1, min_insync: int = 0, isr=("n1", "n2", "n3")) -> tuple[LeaderDuty, Recorder]:
    cfg = Config.from_dict({"cluster": {"zookeeper": "127.0.0.1:2181", "node": "n1", "replicas_ack": replicas_ack,
                                        "min_insync": min_insync, "replica_lag": "3s"}})
    rec = Recorder()
    d = LeaderDuty(rec, ClusterState(epoch=4, leader="n1", endpoint="tcp://x:1", isr=list(isr)), cfg, 1_000)  # type: ignore[arg-type]
    return d, rec


def standby(node: str, position: int) -> Peer:
    p = Peer(node.encode(), f"zq standby {node}", 0, replica_position=position)
    p.node = node
    return p


def test_a_confirmation_waits_for_every_in_sync_standby_not_just_the_first():
    d, _ = duty(replicas_ack=1)
    peers = {b"2": standby("n2", 90), b"3": standby("n3", 40)}
    assert d.replicated_upto(peers, 100) == 40  # n3 is in sync: whoever takes over must have it
    del peers[b"3"]
    assert d.replicated_upto(peers, 100) == 0  # in sync but not connected: wait (until it is dropped)


def test_too_few_in_sync_standbys_hold_every_confirmation():
    d, _ = duty(replicas_ack=1, min_insync=2, isr=("n1", "n2"))
    assert d.replicated_upto({b"2": standby("n2", 100)}, 100) == 0  # one in sync, two needed
    d2, _ = duty(replicas_ack=0, min_insync=2, isr=("n1",))
    assert d2.need == 0  # replicas_ack = 0: nothing waits (min_insync applies with replicas_ack)


def test_a_lagging_standby_leaves_the_set_by_compare_and_set_before_confirmations_go_without_it():
    d, rec = duty()
    peers = {b"2": standby("n2", 100), b"3": standby("n3", 10)}
    d.standby_reported(peers[b"2"], 100, 100, 1_000)
    d.tick(peers, 2_000, 100)
    assert rec.asked == []  # within replica_lag (3 s) of taking over: both stay
    d.standby_reported(peers[b"2"], 100, 100, 4_500)
    d.tick(peers, 4_500, 100)
    assert [a[0] for a in rec.asked] == [["n1", "n2"]]  # n3 has not caught up for 3.5 s
    assert d.replicated_upto(peers, 100) == 10  # not yet written: still waited for
    d.tick(peers, 4_700, 100)
    assert len(rec.asked) == 1  # one change at a time
    rec.answer(True)
    assert d.isr == {"n1", "n2"} and d.replicated_upto(peers, 100) == 100


def test_a_standby_that_caught_up_joins_and_a_refused_change_with_a_newer_epoch_deposes():
    d, rec = duty(isr=("n1", "n3"))
    p, in_sync = standby("n2", 0), standby("n3", 50)
    peers = {b"2": p, b"3": in_sync}
    assert d.replicated_upto(peers, 50) == 50  # n3 has it all; n2 is not in the set
    d.standby_reported(p, 0, 50, 1_000)  # its first report: the journal was at 50
    d.tick(peers, 1_000, 50)
    assert rec.asked and rec.asked[-1][0] == ["n1", "n2", "n3"]  # 0 >= 0 (its previous end): caught up
    # Before ZooKeeper says so, a joining standby is already waited for: once the state
    # names it, it may be elected, so it must hold what is confirmed from then on.
    assert d.replicated_upto(peers, 50) == 0
    rec.state = ClusterState(epoch=5, leader="n4")
    rec.answer(False)  # the compare-and-set failed: someone else wrote the state
    assert d.deposed and not d.serving() and d.isr == d.waited_for == {"n1", "n3"}


def test_the_leader_serves_only_with_its_lease_and_undeposed():
    d, rec = duty()
    assert d.serving()
    rec.lease = False
    assert not d.serving()
    rec.lease = True
    d.deposed = True
    assert not d.serving()
    st = d.stats({}, 5_000)
    assert st["role"] == "leader" and st["epoch"] == 4 and st["serving"] is False and st["isr"] == ["n1", "n2", "n3"]


def test_a_clean_stop_waits_for_the_in_sync_standbys_then_stops_and_gives_up_after_its_time():
    d, rec = duty(replicas_ack=0)
    stopped: list[int] = []
    d.stop_server = lambda: stopped.append(1)
    peers = {b"2": standby("n2", 80), b"3": standby("n3", 100)}
    d.hand_over()
    d.tick(peers, 1_000, 100)  # the end to reach: 100
    assert d.handover_end == 100 and not stopped
    assert d.replicated_upto(peers, 100) == 80  # confirmations now wait for the standbys (replicas_ack 0 or not)
    peers[b"2"].replica_position = 100
    d.tick(peers, 1_200, 130)  # both hold 100: the leader may go (what came after was never confirmed)
    assert stopped == [1]
    d2, _ = duty(replicas_ack=0)
    d2.stop_server = lambda: stopped.append(2)
    d2.hand_over()
    d2.tick({}, 1_000, 100)
    d2.tick({}, 5_999, 100)
    assert stopped == [1]
    d2.tick({}, 6_000, 100)  # five seconds: it stops anyway (standbys gone)
    assert stopped == [1, 2]


def test_only_zookeeper_proves_a_standby_or_deposes_the_leader():
    """A standby's position counts only with the proof ZooKeeper holds for its node (a new
    leader reads them at once); a claimed newer epoch is checked with ZooKeeper, and only
    its answer deposes (zq.server.election does both against a real one:
    tests/cluster/test_hostile_peers.py)."""
    d, rec = duty()
    assert rec.proofs_read
    assert d.proven("n2", "token of n2") and not d.proven("n2", "a guess") and not d.proven("n2", "")
    assert d.stats({}, 1_000)["unproven"] == 2
    d.newer_epoch_claimed(2**62)
    (mine, claimed, on_newer), = rec.epoch_checks
    assert (mine, claimed) == (4, 2**62) and not d.deposed and d.serving()  # asked, not believed
    woke: list[int] = []
    d.wake = lambda: woke.append(1)
    on_newer()  # ZooKeeper says the epoch moved
    assert d.deposed and not d.serving() and woke == [1]


def test_a_session_zookeeper_grants_longer_is_warned_and_a_shorter_one_shortens_the_lease(caplog):
    """ZooKeeper clamps the asked session to its min/max: longer, a silent leader is
    replaced later than configured (a warning says how to fix it); shorter, the leader's
    lease must follow it, or a paused leader could serve past its session."""
    import logging
    from types import SimpleNamespace

    from zq.server.election import Coordinator

    node = SimpleNamespace(asked_ms=2000, granted_ms=0, hosts="127.0.0.1:2181", session_timeout_s=2.0)
    with caplog.at_level(logging.WARNING, logger="zq.election"):
        Coordinator.session_granted(node, 4000)  # type: ignore[arg-type]
    assert "granted a 4000 ms session, not the 2000 ms asked" in caplog.text and node.session_timeout_s == 2.0
    caplog.clear()
    Coordinator.session_granted(node, 4000)  # type: ignore[arg-type]  # the same again (a reconnect): said once
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="zq.election"):
        Coordinator.session_granted(node, 1000)  # type: ignore[arg-type]
    assert "shorter than the 2000 ms asked" in caplog.text and node.session_timeout_s == 1.0
