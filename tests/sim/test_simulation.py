"""Seeded deterministic simulation of the engine with faults (see zq.testing.simulator).

Replay one failing seed with ``pytest tests/sim --zq-seed=N`` or
``python -m zq.testing.simulator --seed N``.
"""

import pytest

from zq.core import delaying, entering, grouping, leases, settling, transactions
from zq.core.queue import Queue
from zq.core.reclaim import Reclaimer
from zq.testing.checkers import InvariantError
from zq.testing.simulator import Simulator


def test_simulation_keeps_every_invariant_and_converges(sim_seed, sim_steps):
    sim = Simulator(sim_seed, sim_steps)
    print(f"SEED={sim_seed} options={sim.options}")
    sim.run()
    assert sim.delivered > 0
    assert not sim.oracle.unfinished()


def test_the_same_seed_gives_the_same_trace():
    assert Simulator(7, 400).run().digest() == Simulator(7, 400).run().digest()
    assert Simulator(7, 400).run().digest() != Simulator(8, 400).run().digest()


def test_the_digests_of_a_range_of_seeds_are_printed_to_compare_two_trees(capsys):
    """``--digests``: what a refactor of the core compares with the tree before it."""
    from zq.testing.simulator import main

    assert main(["--digests", "3", "5", "--steps", "60"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == ["3", Simulator(3, 60).run().digest(), "4", Simulator(4, 60).run().digest()]
    for bad in (["--digests", "5", "3"], ["--digests", "0", "20000"], ["--digests", "1", "2", "--steps", "0"], []):
        with pytest.raises(SystemExit):
            main(bad)


def test_a_step_that_finds_its_work_gives_the_trace_of_one_that_visits_every_queue():
    """The engine visits only the queues something touched and those whose deadline came
    (``Engine.touch``); visiting every queue every step, as it once did, must not change
    one record of the work (crashes and recoveries included; recovery points keep their
    own cadence). Without expiry: a dispatch also takes out messages it finds too old,
    which visiting every queue does sooner."""
    for seed in range(1, 13):
        found = Simulator(seed, 400, expiry=False).run()
        visited = Simulator(seed, 400, visit_all=True, expiry=False).run()
        assert found.work_digest() == visited.work_digest(), f"seed {seed}: the traces differ"


def test_crashes_and_worker_deaths_are_actually_injected():
    sims = [Simulator(seed, 800).run() for seed in range(1, 9)]
    assert sum(s.crashes for s in sims) > 0
    assert any(s.options.p_worker_death > 0 for s in sims)


def test_stale_settles_are_sent_and_refused_and_explain_is_checked():
    """Slow workers settle after their leases ended and the message came back (to them
    or to someone else): the fence's case happens, and the run's checks held; explain's
    answer was compared with the engine's state on thousands of messages."""
    sims = [Simulator(seed, 800).run() for seed in range(1, 9)]
    assert sum(s.stale_settles for s in sims) > 0
    assert sum(s.explained for s in sims) > 1000


def test_retry_schedules_publish_delays_and_parked_groups_are_exercised():
    """The delay checks ran on real cases: retries waiting for the schedule, cancels
    naming their own delay, delayed publishes, and groups parked behind them."""
    from zq.core import records as R

    reasons: dict[str, int] = {}
    parked = 0
    for seed in range(1, 9):
        sim = Simulator(seed, 800).run()
        parked += sim.parked_checks
        for ev in sim.journal.read_events(0):
            if ev.kind == R.DELAYED:
                reasons[ev.reason] = reasons.get(ev.reason, 0) + len(ev.bookmarks)
    assert set(reasons) == {R.DELAY_BACKOFF, R.DELAY_REQUESTED, R.DELAY_PUBLISHED}, reasons
    assert min(reasons.values()) > 20, reasons
    assert parked > 100


def test_tenants_share_fair_queues_and_the_bound_is_reached():
    """The fair-share check ran on real backlogs: some tenant waited at least half as
    long as its bound allows (in longer runs, all of it), and none waited longer."""
    most = 0
    for seed in range(1, 13):
        sim = Simulator(seed, 600).run()
        most = max([most] + [v.fair.most for v in sim.oracle.queues.values() if v.fair is not None])
    assert most >= 50, most


def test_leases_of_connected_workers_are_renewed_up_to_their_maximum_age():
    sims = [Simulator(seed, 800).run() for seed in range(1, 9)]
    assert sum(s.renewals for s in sims) > 20


def test_idle_workers_reclaim_unstarted_work_and_the_checks_ran():
    """Reclaimable workers left work unstarted and idle ones took it back: the checks on
    what was given back, and on idle workers beside unstarted work, ran on real cases.
    (Seeds 1-10: poisoned bodies in some runs since took away a few reclaiming cases.)"""
    sims = [Simulator(seed, 800).run() for seed in range(1, 11)]
    assert sum(s.reclaimed for s in sims) > 50
    assert sum(s.reclaim_checks for s in sims) > 1000


@pytest.mark.interpreted_core
@pytest.mark.parametrize(
    "bug",
    ["sequenced-group-ignores-inflight", "ack-forgets-to-finish", "lease-expiry-drops-message",
     "ordered-queue-ignores-rank", "fence-ignores-epochs", "explain-misplaces-returned",
     "retry-wakes-early", "parked-group-blocks-all", "renewal-ignores-max-age", "renewal-never-renews",
     "causes-miss-lease-expiries", "fair-share-ignores-tenants", "reclaim-takes-started-work",
     "reclaim-never-asks", "reclaims-count-as-deliveries", "poison-let-in", "poison-everything",
     "redelivery-back-to-the-stuck-holder", "settles-visit-no-queue", "deadlines-never-scheduled",
     "tx-ignores-the-fence", "tx-ids-not-from-the-input"],
)
def test_the_checkers_catch_a_planted_engine_bug(bug, monkeypatch):
    """A checker that cannot fail proves nothing: plant a bug, expect a failure."""
    if bug == "tx-ignores-the-fence":  # a transaction on a delivery no longer live publishes anyway
        monkeypatch.setattr(transactions, "not_live", lambda q, sub, seqs, epochs, next_seq: {})
    elif bug == "tx-ids-not-from-the-input":  # a redelivered input's outputs are stored again
        fresh = iter(range(10**9))
        monkeypatch.setattr(transactions, "derived_id",
                            lambda queue, bookmark, index, cancel_of=0: f"zq:{queue}:{bookmark}.{next(fresh)}:{index}")
    elif bug == "sequenced-group-ignores-inflight":
        monkeypatch.setattr(grouping, "can_go", lambda q, grp: True)
    elif bug == "ordered-queue-ignores-rank":
        original_enqueue = entering.enqueue_ranked
        monkeypatch.setattr(entering, "enqueue_ranked", lambda q, seq, gid, key: original_enqueue(q, seq, gid, seq))
    elif bug == "explain-misplaces-returned":
        import zq.core.explain as explain_module

        original_place = explain_module.waiting_place
        monkeypatch.setattr(explain_module, "waiting_place",
                            lambda q, seq, group: None if seq in q.returned else original_place(q, seq, group))
    elif bug == "retry-wakes-early":
        original_advance = Queue.advance

        def advance(self, now_ms, watermark):
            delaying.wake_due(self, now_ms + 40)  # 40 ms early
            original_advance(self, now_ms, watermark)

        monkeypatch.setattr(Queue, "advance", advance)
    elif bug == "parked-group-blocks-all":
        original_can_go = grouping.can_go
        monkeypatch.setattr(grouping, "can_go", lambda q, grp: not q.delays.due and original_can_go(q, grp))
    elif bug == "renewal-ignores-max-age":
        original_renew = leases.renew
        monkeypatch.setattr(leases, "renew", lambda q, lease, deadline_ms: original_renew(
            q, lease, deadline_ms + q.settings.lease_ms))
    elif bug == "renewal-never-renews":  # a connected worker's lease just ends, as without max_lease_age
        from zq.core import records as R

        def renew(q, lease, deadline_ms):
            for seq in list(lease.seqs):
                if q.lease_of.get(seq) is lease:
                    settling.end_lease_of(q, seq, R.LEASE_EXPIRED)

        monkeypatch.setattr(leases, "renew", renew)
    elif bug == "causes-miss-lease-expiries":
        from zq.core import records as R

        original_note = Queue.note_cause
        monkeypatch.setattr(Queue, "note_cause", lambda self, seq, kind, consumer, now_ms, error="": "" if
                            kind == R.LEASE_EXPIRED else original_note(self, seq, kind, consumer, now_ms, error))
    elif bug == "fair-share-ignores-tenants":  # every message in one share: plain publish order
        from zq.core.fairshare import FairShare

        monkeypatch.setattr(FairShare, "tenant", lambda self, headers: "")
    elif bug == "reclaim-takes-started-work":  # the holder's "kept" ignored: started work taken back too
        original_reclaim = Reclaimer.take_back
        monkeypatch.setattr(Reclaimer, "take_back", lambda self, sub, seqs, epochs, kept, kept_epochs: original_reclaim(
            self, sub, seqs + kept, epochs + kept_epochs, [], []))
    elif bug == "poison-let-in":  # a message the queue cannot evaluate enters anyway, at level 0
        monkeypatch.setattr(entering, "judge", lambda q, seq, headers, payload, topic: (0, None))
    elif bug == "poison-everything":  # every message of an ordered queue set aside
        def judge(q, seq, headers, payload, topic):
            entering.poison(q, seq, ValueError("planted"))

        monkeypatch.setattr(entering, "judge", judge)
    elif bug == "redelivery-back-to-the-stuck-holder":  # an expired or failed delivery: the usual choice
        from zq.core import choosing
        from zq.core.aside import SetAside

        original_choose_for = choosing.choose_for
        monkeypatch.setattr(choosing, "choose_avoiding", lambda q, grp, avoid: choosing.choose(q, grp))
        monkeypatch.setattr(choosing, "choose_for", lambda q, grp, seq, avoid=None: original_choose_for(q, grp, seq))
        monkeypatch.setattr(SetAside, "someone_else_takes", lambda self, sub, seq: False)
    elif bug == "settles-visit-no-queue":  # acks and cancels change a queue the step then skips
        from zq.core.engine import Engine

        def sub(self, sub_id):
            return self.subs[sub_id]

        monkeypatch.setattr(Engine, "sub", sub)
    elif bug == "deadlines-never-scheduled":  # an idle queue's lease expiries and delays are never found
        from zq.core.engine import Engine

        monkeypatch.setattr(Engine, "schedule", lambda self, q: None)
    elif bug == "reclaim-never-asks":
        monkeypatch.setattr(Reclaimer, "plan", lambda self: [])
    elif bug == "reclaims-count-as-deliveries":
        monkeypatch.setattr(Queue, "counted_deliveries", lambda self, seq, m: m & 0xFFFF)
    elif bug == "fence-ignores-epochs":
        monkeypatch.setattr(settling, "fence", lambda q, sub, seqs, epochs: (list(seqs), []))
    elif bug == "ack-forgets-to-finish":
        original = settling.ack

        def ack(q, sub, seq, now_ms=0):
            result = original(q, sub, seq, now_ms)
            if result is None and seq % 5 == 0:
                if q.ordered:
                    q.ranks[seq] = seq  # what finish() forgot
                settling.put_back(q, seq, q.meta.get(seq, 0) or 1)  # acked, yet back in the queue
            return result

        monkeypatch.setattr(settling, "ack", ack)
    else:

        def end_lease_of(q, seq, kind, now_ms=-1):
            lease, m = leases.release(q, seq)  # ... and never puts it back
            return None

        monkeypatch.setattr(settling, "end_lease_of", end_lease_of)
    caught = 0
    for seed in range(1, 13):
        try:
            Simulator(seed, 600).run()
        except InvariantError:
            caught += 1
            break  # (one seed that catches it is the proof; the rest would only cost time)
    assert caught > 0, f"no seed caught the planted bug {bug!r}"


def test_transactions_are_applied_and_refused_across_crashes_and_the_check_ran():
    """Settle-and-publish steps (``Simulator.transact``): applied ones checked whole at
    their commit, refused ones (a stale delivery, a full queue) checked to leave nothing."""
    sims = [Simulator(seed, 600).run() for seed in range(1, 9)]
    assert sum(s.transactions for s in sims) > 200, [s.transactions for s in sims]
    assert sum(s.tx_refused for s in sims) > 100, [s.tx_refused for s in sims]
    assert sum(s.crashes for s in sims if s.transactions) > 3
    assert sum(len(s.tx_ids) for s in sims) > 200


def test_expired_and_failed_work_moves_on_to_other_consumers_and_the_check_ran():
    sims = [Simulator(seed, 600).run() for seed in range(1, 9)]
    assert sum(s.moved_on for s in sims) > 20, [s.moved_on for s in sims]


def test_poisoned_bodies_are_published_and_set_aside_across_crashes():
    """Runs with unreadable bodies: ordered and last-value queues set them aside as poison
    (the oracle checks each one is exactly a message the queue cannot evaluate, in the
    step it entered, never delivered), filters skip them, and crashes and recoveries
    happen in the same runs."""
    from zq.core import records as R

    poisoned = crashes = 0
    for seed in range(1, 40):
        probe = Simulator(seed, 1)
        if not probe.options.p_poison or not any(q.priority or q.sort_key or q.lvq_key for q in probe.options.queues):
            continue
        sim = Simulator(seed, 600).run()
        crashes += sim.crashes
        poisoned += sum(len(ev.bookmarks) for ev in sim.journal.read_events(0)
                        if ev.kind == R.EXPIRED and ev.reason == R.REASON_POISON)
        if poisoned > 50 and crashes:
            break
    assert poisoned > 50 and crashes > 0, (poisoned, crashes)


def test_dispatch_that_stops_at_its_filter_budget_keeps_every_invariant():
    """The engine's per-step budget of filter evaluations, set tiny: dispatch stops
    part-way through nearly every step with filtered subscriptions and goes on at the
    next, through crashes, worker deaths and lease expiries, and every invariant holds
    (nothing acked redelivered, nothing lost, group order, credit) and everything ends."""
    ran = stopped = 0
    for seed in range(1, 30):
        probe = Simulator(seed, 1)
        if not probe.options.p_filtered:
            continue
        sim = Simulator(seed, 500, dispatch_budget=3)
        sim.run()
        ran += 1
        stopped += sim.engine.dispatch_deferred  # (since the last restart)
        if ran >= 6:
            break
    assert ran >= 6 and stopped > 0, (ran, stopped)
