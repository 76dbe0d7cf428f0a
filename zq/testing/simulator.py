"""Deterministic simulation of the engine with injected faults, from one seed.

A run draws its own profile from the seed (queue settings, how often workers die,
how often the dispatcher crashes, how far time jumps) and then takes steps. Each
step feeds the engine some inputs, drains it, and either commits the step's
records to an in-memory journal or *crashes* first, losing them, after which the
engine is rebuilt from the journal, exactly as a restarted server would be. Only
committed deliveries reach the simulated workers (the adapter's contract).

After every step ``Oracle.check`` verifies the safety properties. Then a liveness
phase stops the faults, keeps workers acknowledging and moves time on; every
confirmed message must end acknowledged or expired within a bounded number of
steps.

Reproduce a failure with ``python -m zq.testing.simulator --seed N``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from dataclasses import dataclass, field

import msgspec

from zq.core import grouping, inventory, limits
from zq.core import records as R
from zq.core.leases import G_SHIFT
from zq.core.engine import Engine, Output
from zq.core.queue import Queue
from zq.core.errors import QueueFullError, ZqError
from zq.core.settings import QueueSettings
from zq.core.explain import explain
from zq.core.transactions import DERIVED_PREFIX, derived_id
from zq.core.expr import compile_filter
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal
from zq.testing.checkers import InvariantError, Oracle


COLORS = ("red", "blue", "green")
PRIORITIES = (None, "0", "1", "2", "3", "10")  # the spread is checkers.PRIORITY_SPREAD
TENANTS = ("a", "b", "c", "")
FILTERS = ("color = 'red'", "color IN ('red', 'blue')", "color != 'green'", "NOT color = 'red'")
# Poison (runs with ``p_poison``): the content expressions read the body, and some bodies
# cannot be read (not UTF-8 inside, nested past the decoder's depth): a queue that must
# evaluate one sets it aside as poison, a filter does not match it (checkers.Oracle).
POISON_BODIES = (b'{"color": "\xff\xfe", "prio": "\xff"}', b'{"prio": ' + b"[" * 1100 + b"]" * 1100 + b"}",
                 b"\x82\xa5color\xa3red\xa4prio\xa2\xff\xfe")  # the last: msgpack


def read_body(expression: str) -> str:
    """The simulator's header expressions, reading the body instead ("prio" -> "/prio")."""
    for name in ("color", "prio"):
        expression = expression.replace(name, "/" + name)
    return expression


@dataclass
class SimOptions:
    seed: int
    steps: int
    queues: list[QueueSettings]
    topics: list[str]
    groups: list[str | None]
    p_publish: float
    p_ack: float
    p_cancel: float
    p_expire: float
    p_extend: float
    p_subscribe: float
    p_filtered: float
    p_pull: float
    p_worker_death: float
    p_crash: float
    p_crash_before_commit: float
    max_jump_ms: int
    p_delay: float = 0.0  # a publish waits (not-before) up to 500 ms
    p_poison: float = 0.0  # a publish's body cannot be read; >0: content expressions read bodies

    @classmethod
    def draw(cls, seed: int, steps: int) -> "SimOptions":
        rng = random.Random(seed)
        queues = []
        for i in range(rng.randint(1, 3)):
            semantics = rng.choice(["at-least-once", "at-least-once", "at-most-once"])
            fairness = rng.choice(["fast", "round-robin", "proportional"]) if semantics == "at-least-once" else "round-robin"
            queues.append(
                QueueSettings(
                    name=f"q{i}",
                    topics=rng.choice([f"t{i}", f"t{i}|shared", "t.*"]),
                    semantics=semantics,
                    fairness=fairness,
                    lease_ms=rng.choice([50, 200, 1000]),
                    max_per_subscription_backlog=rng.choice([1, 2, 4, 16]),
                    max_cancels=rng.choice([0, 2, 5]),
                    max_deliveries=rng.choice([0, 3, 10]),
                    expiration_ms=rng.choice([0, 0, 500, 3000]),
                    dead_letter=rng.choice([None, f"q{i}.dead"]),
                    group_header=rng.choice([None, "group", "group"]),
                    group_policy=rng.choice(["sequenced", "exclusive", "one-in-flight"]),
                    filter=rng.choice([None, None, "color != 'blue'"]),
                    max_depth=rng.choice([0, 0, 0, 20, 60]),
                    overflow=rng.choice(["reject", "ring", "flow-control"]),
                    lvq_key=rng.choice([None, None, None, "color"]),
                    barrier=rng.choice([None, None, None, "color = 'green' AND group IS NULL"]),
                )
            )
            if semantics == "at-least-once" and rng.random() < 0.4:  # session-wide renewal up to a maximum age
                queues[-1] = msgspec.structs.replace(queues[-1], max_lease_age_ms=queues[-1].lease_ms * rng.choice([2, 6]))
            if semantics == "at-least-once" and rng.random() < 0.3:  # limits per cause of an unfinished delivery
                queues[-1] = msgspec.structs.replace(queues[-1], max_failures=rng.choice([0, 2, 4]),
                                                     max_lease_expiries=rng.choice([0, 3]),
                                                     max_consumer_gone=rng.choice([0, 1, 2]))
            if rng.random() < 0.5:  # a retry schedule: cancels and lease expiries wait before the next try
                queues[-1] = msgspec.structs.replace(queues[-1], backoff_ms=rng.choice([[30], [20, 100, 400]]),
                                                     backoff_jitter=rng.choice([0.0, 0.5]))
            if semantics == "at-least-once" and rng.random() < 0.15:
                queues[-1] = msgspec.structs.replace(queues[-1], browse_only=True, barrier=None)
            elif rng.random() < 0.3:  # an ordered queue: by the "prio" header
                order = rng.choice([{"priority": "prio"}, {"sort_key": "prio"}])
                overflow = "reject" if queues[-1].overflow == "ring" else queues[-1].overflow
                queues[-1] = msgspec.structs.replace(queues[-1], barrier=None, overflow=overflow, **order)
            elif rng.random() < 0.3:  # only the first few in memory, the rest read back from the journal
                queues[-1] = msgspec.structs.replace(queues[-1], barrier=None, lvq_key=None,
                                                     target_queue_depth=rng.choice([2, 5, 20]))
        fair_rng = random.Random(seed * 131 + 17)  # its own stream: the other draws stay as they were
        for i, q in enumerate(queues):
            if fair_rng.random() < 0.3 and not q.sort_key:  # tenants share the queue by weight
                queues[i] = msgspec.structs.replace(
                    q, tenant_header="tenant", tenant_weights=fair_rng.choice([{}, {"a": 3}, {"a": 2, "b": 4}]),
                    priority=fair_rng.choice([None, "prio"]), barrier=None, browse_only=False, target_queue_depth=0,
                    overflow="reject" if q.overflow == "ring" else q.overflow)
                if fair_rng.random() < 0.5:  # grouped messages wait for their groups: the bound counts the rest
                    queues[i] = msgspec.structs.replace(queues[i], group_header=None)
                if queues[i].priority and fair_rng.random() < 0.5:
                    queues[i] = msgspec.structs.replace(queues[i], priority_aging=fair_rng.choice([1, 3]))
        poison_rng = random.Random(seed * 131 + 29)  # its own stream: the other draws stay as they were
        p_poison = poison_rng.choice([0.0, 0.0, 0.02, 0.05])
        if p_poison:
            for i, q in enumerate(queues):
                queues[i] = msgspec.structs.replace(q, **{k: read_body(getattr(q, k)) for k in
                                                          ("priority", "sort_key", "lvq_key", "filter") if getattr(q, k)})
        topics = sorted({f"t{i}" for i in range(len(queues))} | {"shared"})
        ngroups = rng.choice([1, 3, 10])
        return cls(
            seed=seed,
            steps=steps,
            queues=queues,
            topics=topics,
            groups=[None] + [f"g{i}" for i in range(ngroups)],
            p_publish=rng.uniform(0.2, 0.6),
            p_ack=rng.uniform(0.2, 0.8),
            p_cancel=rng.uniform(0.0, 0.2),
            p_expire=rng.uniform(0.0, 0.05),
            p_extend=rng.uniform(0.0, 0.1),
            p_subscribe=rng.uniform(0.02, 0.1),
            p_filtered=rng.choice([0.0, 0.3, 0.8]),
            p_pull=rng.choice([0.0, 0.0, 0.3]),
            p_worker_death=rng.choice([0.0, 0.01, 0.05]),
            p_crash=rng.choice([0.0, 0.005, 0.02]),
            p_crash_before_commit=rng.choice([0.0, 0.5]),
            max_jump_ms=rng.choice([5, 50, 400]),
            p_delay=rng.choice([0.0, 0.1, 0.4]),
            p_poison=p_poison,
        )


@dataclass
class Worker:
    name: str
    sub_id: str
    queue: str
    held: list[tuple[int, int]] = field(default_factory=list)  # (bookmark, epoch: its delivery count)
    filter: str | None = None
    pull: bool = False  # claims instead of a subscription
    destructive: bool = False  # the claim of this step removes what it takes
    reclaimable: bool = False  # deliveries wait in ``untaken`` until started; revokes give those back
    untaken: list[tuple[int, int]] = field(default_factory=list)  # delivered, not started (bookmark, epoch)
    revokes: list[tuple[list[int], list[int]]] = field(default_factory=list)  # asked back, not answered


class Simulator:
    def __init__(self, seed: int, steps: int = 2000, dispatch_budget: int = 0, visit_all: bool = False,
                 expiry: bool = True) -> None:
        self.options = SimOptions.draw(seed, steps)
        # ``visit_all``: every queue visited every step, as before the engine found its work
        # (``Engine.touch``); without expiry the same seed gives the same trace either way.
        # (With expiry a dispatch also takes out messages it finds too old: visited every
        # step, that happens sooner; found by its deadline, at the next sweep, <= 1 s later.)
        self.visit_all = visit_all
        if not expiry:
            self.options.queues = [msgspec.structs.replace(q, expiration_ms=0) for q in self.options.queues]
        self.dispatch_budget = dispatch_budget  # >0: the engine's filter evaluations per drain (tiny: stops often)
        self.rng = random.Random(seed * 7919 + 1)
        self.tenant_rng = random.Random(seed * 7919 + 2)
        self.reclaim_rng = random.Random(seed * 7919 + 3)  # its own stream: the other draws stay as they were
        self.poison_rng = random.Random(seed * 7919 + 4)
        self.p_reclaimable = self.reclaim_rng.choice([0.0, 0.5, 0.9])
        self.released: set[tuple[str, int, int]] = set()  # this step's (consumer, bookmark, epoch) given back
        self.reclaimed = 0  # deliveries given back unstarted (reclaiming at work)
        self.reclaim_checks = 0  # steps where an idle subscriber was checked not to starve beside unstarted work
        self.fair = any(q.tenant_header for q in self.options.queues)
        self.journal = MemoryJournal()
        self.engine = Engine(self.options.queues, content=self.journal.get_message, scan=self.journal.messages_from,
                             find_id=self.journal.find_id)
        self.engine.visit_all = visit_all
        if dispatch_budget:
            self.engine.dispatch_budget = dispatch_budget
        self.oracle = Oracle()
        self.now_ms = 0
        self.workers: dict[str, Worker] = {}
        self.worker_serial = 0
        self.trace = hashlib.sha256()
        # The trace of the work alone: recovery points are bookkeeping, written on their own
        # cadence (every interval for the queues visited, in turn for the others).
        self.work_trace = hashlib.sha256()
        self.crashes = 0
        self.delivered = 0  # every message sent to a worker (leased, browsed or a barrier)
        self.stale_settles = 0  # settles naming a delivery no longer live, refused (the fence at work)
        self.explained = 0  # messages whose explain was checked against the oracle
        self.parked_checks = 0  # steps where a parked group was checked not to block the others
        self.renewals = 0  # the most lease renewals a queue made (max_lease_age at work)
        self.step_no = 0
        # Moving on: (queue, bookmark) -> the consumer whose delivery of it expired or failed,
        # until it is delivered again (``check_moving_on``); what a crash forgets, the engine does too.
        self.last_holder: dict[tuple[str, int], str] = {}
        self.moved_on = 0  # redeliveries after an expiry or failure that went to someone else
        self.held_back: dict[str, int] = {}  # sub id -> credit withheld during this step's drain
        # Transactions (settle and publish in one commit): its own stream, so the other draws
        # stay as they were. ``tx_step``: this step's applied ones, checked at its commit;
        # ``tx_ids``: every derived output id journaled so far (each at most once).
        self.tx_rng = random.Random(seed * 7919 + 5)
        self.p_tx = self.tx_rng.choice([0.0, 0.3, 0.7])
        self.tx_step: list[tuple[list[tuple[str, str]], list[tuple[str, int]]]] = []
        self.tx_ids: set[tuple[str, str]] = set()  # (topic, id)
        self.transactions = 0  # applied
        self.tx_refused = 0  # not applied: an input no longer live, or an output refused

    # ------------------------------------------------------------- running

    def run(self) -> "Simulator":
        try:
            for _ in range(self.options.steps):
                self.step(faults=True)
            self.liveness()
        except (InvariantError, AssertionError) as exc:
            raise InvariantError(f"{exc}\nreproduce with: python -m zq.testing.simulator --seed {self.options.seed}") from exc
        return self

    def step(self, *, faults: bool) -> None:
        self.step_no += 1
        o, rng = self.options, self.rng
        # Healed: time moves slower than any lease, so prompt workers keep their leases.
        jump = o.max_jump_ms if faults else min(o.max_jump_ms, min(q.lease_ms for q in o.queues) // 4)
        self.now_ms += rng.randint(0, jump)
        self.engine.advance(self.now_ms)
        if (faults and rng.random() < o.p_subscribe) or not self.workers:
            self.subscribe()
        if rng.random() < o.p_publish:
            self.publish(rng.randint(1, 8))
        self.released = set()
        for w in list(self.workers.values()):
            if w.reclaimable:
                self.start_and_answer(w, faults)
            self.work(w, faults)
            if w.pull and rng.random() < 0.5:
                w.destructive = rng.random() < 0.2
                self.engine.claim(w.sub_id, w.queue, w.name, rng.randint(1, 4), rng.choice([50, 500, 5000]),
                                  self.now_ms, destructive=w.destructive, filter=w.filter)
        if faults and rng.random() < o.p_worker_death and self.workers:
            self.kill_worker(rng.choice(sorted(self.workers)))
        # Credit withheld after a reclaim comes back at the end of the drain (``end_hold``):
        # during it, those subscriptions had that much less (``check_moving_on``).
        self.held_back = {s.sub_id: s.held_back for q in self.engine.queues.values() for s in q.reclaiming.holding}
        out = self.engine.drain(self.now_ms)
        for w in self.workers.values():
            if w.pull:
                self.engine.end_claim(w.sub_id)  # answered: the claim is over
        self.journal.append(out.records)
        if faults and rng.random() < o.p_crash:
            self.crash(lose_step=rng.random() < o.p_crash_before_commit, out=out)
            return
        self.commit(out)

    def commit(self, out: Output) -> None:
        self.journal.commit(self.now_ms)
        self.check_transactions(out)
        for rec in out.records:
            self.trace.update(repr(rec).encode())
            if type(rec) is not R.RecoveryPoint:
                self.work_trace.update(repr(rec).encode())
        self.oracle.committed(self.engine, out.records)
        for d in out.deliveries:
            self.delivered += len(d.seqs)
            w = self.workers_by_sub().get(d.sub_id)
            assert w is not None, f"delivery to unknown subscription {d.sub_id}"
            if w.filter is not None:
                check = compile_filter(w.filter)
                for seq in d.seqs:
                    m = self.journal.get_message(seq)
                    if m is None or not check(m.headers, m.payload, m.topic):
                        raise InvariantError(f"{d.sub_id} with filter {w.filter!r} got non-matching {seq}: {m}")
            if w.reclaimable:
                w.untaken.extend((s, n) for s, n in zip(d.seqs, d.deliveries) if n)
            elif not (w.pull and w.destructive):
                w.held.extend((s, n) for s, n in zip(d.seqs, d.deliveries) if n)  # 0: a barrier, nothing to settle
        by_sub = self.workers_by_sub()
        for r in out.revokes:
            by_sub[r.sub_id].revokes.append((r.seqs, r.epochs))
        self.check_reclaimed(out)
        self.check_moving_on(out)
        self.oracle.check(self.engine)
        self.check_nothing_forgotten()
        self.check_delays()
        self.check_explain()
        for s in self.options.queues:
            q = self.engine.queues[s.name]
            if s.max_depth and s.overflow == "reject" and q.held() > s.max_depth:
                raise InvariantError(f"{s.name}: {q.held()} messages held over max_depth {s.max_depth} (reject)")
            if s.lvq_key:
                keys = [lvq_key(q, self.journal.get_message(seq)) for seq in inventory.waiting_set(q)]
                keys = [k for k in keys if k is not None]
                if len(keys) != len(set(keys)):
                    raise InvariantError(f"{s.name}: more than one available message per key: {sorted(keys)}")

    def check_nothing_forgotten(self) -> None:
        """A step visits only the queues something touched and those whose deadline came
        (``Engine.touch``, ``Engine.schedule``): after a drain, every other queue has
        nothing left to do, and its next deadline is in the engine's heap by then."""
        e = self.engine
        for q in e.queues.values():
            if q.touched:
                continue
            left = [what for what, there in (
                ("a dispatch", q.dirty), ("held credit", q.reclaiming.holding), ("events", q.events_out),
                ("delays", q.delays_out), ("expiries", q.expired_out),
                ("deliveries", any(s.out_seqs or s.barrier_out for s in q.subs))) if there]
            if left:
                raise InvariantError(f"queue {q.name!r} was not visited but has {', '.join(left)} to do")
            due = [d for d in (q.next_deadline_ms(), e.next_expiry_ms(q)) if d is not None]
            if due and not 0 <= q.scheduled_ms <= min(due):
                raise InvariantError(f"queue {q.name!r}: its next deadline {min(due)} is not in the engine's heap "
                                     f"(scheduled: {q.scheduled_ms})")

    def check_transactions(self, out: Output) -> None:
        """Settle and publish are one commit: every transaction applied this step has
        all its outputs and its settle in the step's records (an output the dedup window
        absorbed: journaled before), and no derived output id is ever journaled twice
        (a redelivered input's outputs, published again, are absorbed)."""
        settled = {(r.queue, seq) for r in out.records if type(r) is R.Event and r.kind in (R.ACKED, R.CANCELLED)
                   for seq in r.bookmarks}
        for r in out.records:
            if type(r) is R.Message and r.msg_id is not None and r.msg_id.startswith(DERIVED_PREFIX):
                if (r.topic, r.msg_id) in self.tx_ids:
                    raise InvariantError(f"output {r.msg_id} on {r.topic} journaled twice (again at {r.seq})")
                self.tx_ids.add((r.topic, r.msg_id))
        for ids, inputs in self.tx_step:
            missing = [i for i in ids if i not in self.tx_ids]
            unsettled = [x for x in inputs if x not in settled]
            if missing or unsettled:
                raise InvariantError(f"a transaction committed in part: outputs {missing} or settles {unsettled} "
                                     "missing from its commit")
        self.tx_step = []

    def transact(self, w: Worker, op: str, chosen: list[tuple[int, int]], delay_ms: int, error: str) -> None:
        """Settle and publish in one commit, as a pipeline stage does: 1-3 outputs to the
        simulation's topics (consumed in turn). Applied exactly when every input is the
        live delivery and the outputs are taken; otherwise nothing of it happens."""
        q = self.engine.queues[w.queue]
        by_seq = newest(chosen)
        seqs = sorted(by_seq)
        epochs = [by_seq[seq] for seq in seqs]
        live = len(self.live(w, by_seq)) == len(seqs)
        rng = random.Random(f"{q.name}:{seqs[0]}")  # a stage's outputs follow from its input: again, the same
        outputs = [(rng.choice(self.options.topics), [(b"x", {"color": rng.choice(COLORS)}, None)
                                                      for _ in range(rng.randint(1, 2))]) for _ in range(rng.randint(1, 2))]
        ids, index = [], 0
        for topic, items in outputs:
            for _ in items:
                ids.append((self.engine.routes.resolve_topic(topic),
                            derived_id(q.name, seqs[0], index, epochs[0] if op == "cancel" else 0)))
                index += 1
        records_before = len(self.engine.records)
        try:
            refused, published = self.engine.transact(w.sub_id, op, seqs, epochs, outputs, self.now_ms,
                                                      delay_ms=delay_ms, error=error)
        except ZqError:  # an output refused (a full reject queue): nothing happened
            refused, published = {"refused": seqs}, []
            if not live:
                raise InvariantError(f"{w.sub_id} tx on {seqs}: inputs not live, yet the outputs were judged first")
        if refused:
            self.tx_refused += 1
            if live and "refused" not in refused:
                raise InvariantError(f"{w.sub_id} tx on live deliveries {seqs} refused: {refused}")
            fresh = [r for r in self.engine.records[records_before:] if type(r) is R.Message]
            if fresh or published:
                raise InvariantError(f"{w.sub_id} tx refused ({refused}) yet published {fresh or published}")
            return
        if not live:
            raise InvariantError(f"{w.sub_id} tx applied on {seqs}, not all live deliveries")
        self.transactions += 1
        self.tx_step.append((ids, [(q.name, seq) for seq in seqs]))

    def check_reclaimed(self, out: Output) -> None:
        """Reclaiming: the engine takes back exactly what a holder gave back unstarted (so
        no started work is ever taken back, and a given-back delivery is never the
        holder's to settle: ``start_and_answer`` checks its settle is refused); and an
        idle subscriber never waits beside a reclaimable holder's unstarted work while
        nothing is asked back: after each drain, with a subscription holding nothing and
        no revoke unanswered, no reclaimable holder has two or more unstarted deliveries
        that it could take (ungrouped, taken back fewer than the maximum, and matching
        its filter)."""
        for rec in out.records:
            if type(rec) is R.Event and rec.kind == R.RECLAIMED:
                for seq, d in zip(rec.bookmarks, rec.deliveries):
                    if (rec.consumer, seq, d) not in self.released:
                        raise InvariantError(f"{rec.queue}: {seq} (delivery {d}) taken back from {rec.consumer}, "
                                             "which did not give it back")
                self.reclaimed += len(rec.bookmarks)
        revoking = {r.sub_id for r in out.revokes}
        for q in self.engine.queues.values():
            if not q.reclaiming.subs or any(s.revoking for s in q.subs) or any(s.sub_id in revoking for s in q.subs):
                continue
            by_sub = self.workers_by_sub()
            hungry = [by_sub[s.sub_id] for s in q.subs if s.used == 0 and s.backlog > 0 and s.sub_id in by_sub]
            if not hungry:
                continue
            self.reclaim_checks += 1
            checks = [compile_filter(w.filter) if w.filter else None for w in hungry]
            for s in q.subs:
                w = by_sub.get(s.sub_id)
                if w is None or not w.reclaimable:
                    continue
                open_ = []
                for seq, epoch in w.untaken:
                    lease = q.lease_of.get(seq)
                    if lease is None or lease.sub is not s or q.deliveries_of(seq) != epoch or q.meta[seq] >> G_SHIFT:
                        continue
                    if q.reclaiming.given.get(seq, 0) >= limits.RECLAIMS_PER_MESSAGE_MAX:
                        continue
                    m = self.journal.get_message(seq)
                    if any(c is None or (m is not None and c(m.headers, m.payload, m.topic)) for c in checks):
                        open_.append(seq)
                if len(open_) >= 2:
                    raise InvariantError(f"{q.name}: {[w.sub_id for w in hungry]} idle while {w.sub_id} holds "
                                         f"{len(open_)} unstarted deliveries it could take ({open_[:5]}); none asked back")

    def check_moving_on(self, out: Output) -> None:
        """A message whose delivery expired or failed goes back to that consumer only when
        nobody else could take it: when it does, after the drain no other subscription of
        the queue has credit and a filter that takes it (credit only shrinks during a
        drain, but for credit withheld after a reclaim, given back at its end: counted
        without it). Exclusive and sequenced groups follow their owner, and claims come
        and go: both are left out."""
        for rec in out.records:
            if type(rec) is not R.Event:
                continue
            kind = rec.kind
            if kind == R.LEASE_EXPIRED or (kind == R.CANCELLED and rec.reason):
                q = self.engine.queues.get(rec.queue)
                for seq in rec.bookmarks:
                    if q is not None and not (q.owned and self.grouped(q, seq)):
                        self.last_holder[(rec.queue, seq)] = rec.consumer
            elif kind == R.LEASED:
                q = self.engine.queues.get(rec.queue)
                for seq in rec.bookmarks:
                    prev = self.last_holder.pop((rec.queue, seq), None)
                    if prev is None or q is None:
                        continue
                    if prev != rec.consumer:
                        self.moved_on += 1
                        continue
                    others = [s.sub_id for s in q.subs if s.consumer != prev and not s.pull
                              and s.used < s.backlog - self.held_back.get(s.sub_id, 0)
                              and (s.match is None or s.match(seq))]
                    if others:
                        raise InvariantError(f"{rec.queue}: {seq}, expired or failed at {prev}, went back to it "
                                             f"while {others} had credit for it")
            elif kind in (R.ACKED, R.EXPIRED, R.RETURNED):
                for seq in rec.bookmarks:
                    self.last_holder.pop((rec.queue, seq), None)

    def grouped(self, q: Queue, seq: int) -> bool:
        """``seq`` belongs to a group of ``q`` (read from the journal: it may be gone from the queue)."""
        m = self.journal.get_message(seq)
        header = q.settings.group_header
        return m is not None and bool(header) and m.headers.get(header) is not None

    def check_delays(self) -> None:
        """Retry times are honoured within a tick: nothing still waits for a time that has
        come (``advance`` woke it). Delivery before its time is the oracle's check. And a
        parked group never blocks another: with a consumer free to take it, no group
        that could go is left waiting while others are parked."""
        for q in self.engine.queues.values():
            ended = [seq for seq, lease in q.lease_of.items() if lease.deadline_ms <= self.now_ms]
            if ended:
                raise InvariantError(f"{q.name}: {ended[:5]} still leased after their leases ended (now {self.now_ms})")
            max_age = q.settings.max_lease_age_ms
            if max_age:  # renewed or extended, no delivery is held past its maximum age
                for seq, lease in q.lease_of.items():
                    if lease.deadline_ms > lease.started_ms + max_age:
                        raise InvariantError(f"{q.name}: {seq} leased until {lease.deadline_ms}, past its maximum age "
                                             f"(delivered {lease.started_ms} + {max_age})")
                self.renewals = max(self.renewals, q.renewed)
            if not q.delays.due:
                continue
            late = sorted(seq for seq, (due, _) in q.delays.due.items() if due <= self.now_ms)
            if late:
                raise InvariantError(f"{q.name}: {late[:5]} still wait for a time that has come (now {self.now_ms}: "
                                     f"{[q.delays.due[s][0] for s in late[:5]]})")
            if q.filtered or q.browse or q.barrier.waiting or not q.grouped or q.dirty:
                continue  # (dirty: something freed after this drain's dispatch, e.g. a destructive claim's acks)
            if not any(s.used < s.backlog for s in q.subs):
                continue
            self.parked_checks += 1
            for grp in q.groups.values():
                if not grp.has_pending():
                    continue
                head = grp.pending[grp.phead]
                if head in q.delays.due or head in q.removed or head <= q.expired_watermark:
                    continue
                if grouping.can_go(q, grp):
                    raise InvariantError(f"{q.name}: group {grp.name} could go (head {head}) but waits while "
                                         f"{sorted(q.delays.due)[:5]} are delayed")

    def check_explain(self) -> None:
        """``zq explain`` must agree with the truth: for a few messages of each step, its
        state is the oracle's (leased to the consumer the journal says, waiting, or gone)."""
        names = sorted(self.oracle.queues)
        if not names:
            return
        name = self.rng.choice(names)
        view, q = self.oracle.queues[name], self.engine.queues[name]
        if not view.confirmed:
            return
        waiting = inventory.waiting_set(q)
        for seq in self.rng.sample(sorted(view.confirmed), min(2, len(view.confirmed))):
            m = self.journal.get_message(seq)
            doc = explain(self.engine, name, seq, self.now_ms, m.topic if m else None, m.headers if m else None)
            if seq in q.lease_of:
                want = "leased"
            elif seq in waiting:
                want = "waiting"
            else:
                want = "not-in-queue"
            if doc["state"] != want:
                raise InvariantError(f"explain {name} {seq}: says {doc['state']}, the engine has it {want}: {doc}")
            if want == "leased" and not view.browse and seq in view.held and \
                    doc["leased_to"]["consumer"] != view.held[seq]:
                raise InvariantError(f"explain {name} {seq}: leased to {doc['leased_to']}, journal says {view.held[seq]}")
            if seq in view.finished and want == "waiting":
                raise InvariantError(f"explain {name} {seq}: finished in the journal, but {want}")
            self.explained += 1

    def crash(self, *, lose_step: bool, out: Output) -> None:
        """The dispatcher dies; with ``lose_step`` before this step's commit."""
        self.crashes += 1
        if lose_step:
            self.journal.crash()
            self.tx_step = []  # lost whole, with everything else of the step
        else:
            self.journal.commit(self.now_ms)
            self.check_transactions(out)
            self.oracle.committed(self.engine, out.records)
        self.engine = recover_engine(self.journal, self.options.queues)
        self.engine.visit_all = self.visit_all
        if self.dispatch_budget:
            self.engine.dispatch_budget = self.dispatch_budget
        self.oracle.forget_holders()
        self.last_holder.clear()
        self.workers.clear()  # every connection died with the server
        self.engine.advance(self.now_ms)  # as the server's loop does before its first drain
        self.held_back = {}
        out = self.engine.drain(self.now_ms)  # recovery may expire exhausted messages
        self.journal.append(out.records)
        self.commit(out)

    # ------------------------------------------------------------- actions

    def workers_by_sub(self) -> dict[str, Worker]:
        return {w.sub_id: w for w in self.workers.values()}

    def subscribe(self, queue: str | None = None, filtered: bool = True) -> None:
        self.worker_serial += 1
        name = f"w{self.worker_serial}"
        queue = queue or self.rng.choice([q.name for q in self.options.queues])
        sub_id = f"{name}/{queue}"
        flt = None
        if filtered and self.rng.random() < self.options.p_filtered:
            flt = self.rng.choice(FILTERS)
            if self.options.p_poison:
                flt = read_body(flt)
            if self.engine.queues[queue].settings.tenant_header:
                flt = None  # the fair-share bound holds where no filter refuses a tenant's messages
        if filtered and self.rng.random() < self.options.p_pull:
            self.workers[name] = Worker(name, sub_id, queue, filter=flt, pull=True)
            return
        s = self.engine.queues[queue].settings
        reclaimable = (s.semantics == "at-least-once" and not s.browse_only
                       and self.reclaim_rng.random() < self.p_reclaimable)
        self.engine.subscribe(sub_id, queue, name, self.rng.choice([1, 2, 3, 8]), self.now_ms, filter=flt,
                              reclaimable=reclaimable)
        self.workers[name] = Worker(name, sub_id, queue, filter=flt, reclaimable=reclaimable)

    def publish(self, count: int) -> None:
        tenant = self.tenant_rng.choice(TENANTS)  # a burst of one tenant's ("": no header)
        if self.fair:
            count += self.tenant_rng.choice([0, 0, 8, 16])  # backlogs for the fair share to share out
        for _ in range(count):
            topic = self.rng.choice(self.options.topics)
            group = self.rng.choice(self.options.groups)
            headers = {"group": group} if group is not None else {}
            headers["color"] = self.rng.choice(COLORS)
            prio = self.rng.choice(PRIORITIES)
            if prio is not None:
                headers["prio"] = prio
            if tenant:
                headers["tenant"] = tenant
            not_before = 0
            if self.rng.random() < self.options.p_delay:
                not_before = self.now_ms + self.rng.randint(1, 500)
            payload = b"x"
            if self.options.p_poison:
                payload = msgspec.json.encode({"color": headers["color"], "prio": prio})
                if self.poison_rng.random() < self.options.p_poison:
                    payload = self.poison_rng.choice(POISON_BODIES)
            try:
                self.engine.publish(topic, payload, headers, self.now_ms, not_before_ms=not_before)
            except QueueFullError:
                pass  # refused whole, nothing journaled: the oracle never hears of it

    def work(self, w: Worker, faults: bool) -> None:
        o, rng = self.options, self.rng
        if not w.held:
            return
        k = rng.randint(1, len(w.held))
        chosen = rng.sample(w.held, k)
        roll = rng.random()
        extra_ms = 0
        if not faults or roll < o.p_ack:
            op = "ack"
        elif roll < o.p_ack + o.p_cancel:
            op = "cancel"
        elif roll < o.p_ack + o.p_cancel + o.p_expire:
            op = "expire"
        elif roll < o.p_ack + o.p_cancel + o.p_expire + o.p_extend:
            op, extra_ms = "extend", rng.choice([100, 2000])
        else:
            return  # slow worker: holds on (its leases may expire, and its settles go stale)
        delay_ms = rng.choice([-1, -1, 0, 60]) if op == "cancel" else -1  # -1: the queue's schedule
        error = rng.choice(["", "", "boom"]) if op == "cancel" else ""  # a failure, or a plain nack
        q = self.engine.queues[w.queue]
        if (faults and op in ("ack", "cancel") and self.p_tx and not q.browse and not q.settings.allow_ack_unleased
                and self.tx_rng.random() < self.p_tx):
            self.transact(w, op, sorted(chosen), delay_ms, error)
        else:
            self.settle_fenced(w, op, sorted(chosen), extra_ms, delay_ms, error)
        if op != "extend":  # applied or refused, the worker lets go
            w.held = [h for h in w.held if h not in set(chosen)]

    def settle_fenced(self, w: Worker, op: str, chosen: list[tuple[int, int]], extra_ms: int,
                      delay_ms: int = -1, error: str = "") -> None:
        """Settle as a client does, fenced by each delivery's epoch, and check the
        fence: exactly the live deliveries apply; a stale epoch never settles."""
        q = self.engine.queues[w.queue]
        sub = self.engine.subs[w.sub_id]
        by_seq = newest(chosen)
        older = sorted((seq, epoch) for seq, epoch in chosen if epoch < by_seq[seq])
        if older:  # the superseded deliveries' settles: none may apply
            results = self.engine.settle(op, w.sub_id, [x[0] for x in older], [x[1] for x in older], self.now_ms, extra_ms,
                                         delay_ms, error)
            if sum(len(v) for v in results.values()) != len(older):
                raise InvariantError(f"{w.sub_id} {op}: superseded deliveries {older} settled: {results}")
            self.stale_settles += len(older)
        seqs = sorted(by_seq)
        live = self.live(w, by_seq)
        stale = {seq for seq in seqs if (lease := q.lease_of.get(seq)) is not None and lease.sub is sub} - live
        results = self.engine.settle(op, w.sub_id, seqs, [by_seq[seq] for seq in seqs], self.now_ms, extra_ms, delay_ms,
                                     error)
        refused = {seq for v in results.values() for seq in v}
        if q.browse or q.settings.allow_ack_unleased:
            return  # browsers settle without leases; unleased acks apply by design
        if live & refused or (set(seqs) - refused) - live:
            raise InvariantError(f"{w.sub_id} {op} {seqs}: applied {sorted(set(seqs) - refused)}, "
                                 f"live deliveries were {sorted(live)}")
        if not stale <= set(results.get("lost", [])):
            raise InvariantError(f"{w.sub_id} {op}: stale deliveries {sorted(stale)} not reported lost: {results}")
        self.stale_settles += len(stale)

    def live(self, w: Worker, by_seq: dict[int, int]) -> set[int]:
        """The bookmarks of ``by_seq`` (bookmark -> epoch) that are ``w``'s live deliveries."""
        q = self.engine.queues[w.queue]
        sub = self.engine.subs[w.sub_id]
        return {seq for seq, epoch in by_seq.items() if (lease := q.lease_of.get(seq)) is not None and lease.sub is sub
                and q.deliveries_of(seq) == epoch}

    def start_and_answer(self, w: Worker, faults: bool) -> None:
        """A reclaimable worker starts some of what it was delivered (all, once faults
        stop) and answers its revokes (a slow one leaves some unanswered a while):
        what it has not started goes back; the rest it keeps."""
        rng = self.reclaim_rng
        if w.untaken:
            k = len(w.untaken) if not faults else rng.randint(0, len(w.untaken))
            w.held.extend(w.untaken[:k])  # in delivery order, as a client's inbox hands them out
            del w.untaken[:k]
        if not w.revokes or (faults and rng.random() < 0.2):
            return
        untaken = set(w.untaken)
        for seqs, epochs in w.revokes:
            back = [(s, e) for s, e in zip(seqs, epochs) if (s, e) in untaken]
            kept = [(s, e) for s, e in zip(seqs, epochs) if (s, e) not in untaken]
            untaken -= set(back)
            self.engine.release_revoked(w.sub_id, [s for s, _ in back], [e for _, e in back], [s for s, _ in kept],
                                        [e for _, e in kept], self.now_ms)
            self.released.update((w.name, s, e) for s, e in back)
            q = self.engine.queues[w.queue]
            if back and rng.random() < 0.3 and not q.settings.allow_ack_unleased:
                results = self.engine.settle("ack", w.sub_id, [s for s, _ in back], [e for _, e in back], self.now_ms)
                if sum(len(v) for v in results.values()) != len(back):
                    raise InvariantError(f"{w.sub_id}: an ack of deliveries it gave back applied: {back} {results}")
                self.stale_settles += len(back)
        w.revokes = []
        w.untaken = [p for p in w.untaken if p in untaken]

    def kill_worker(self, name: str) -> None:
        w = self.workers.pop(name)
        self.engine.disconnect(w.name, self.now_ms)

    # ------------------------------------------------------------ liveness

    def liveness(self, budget_steps: int | None = None) -> None:
        """Faults off, every queue served, time moves: everything must finish.

        The budget grows with the backlog: a backlog-1 worker finishes one message a step.
        """
        if budget_steps is None:
            budget_steps = 3000 + 2 * sum(len(v) for v in self.oracle.unfinished().values())
        for q in self.options.queues:
            self.subscribe(q.name, filtered=False)
        for name in sorted(self.engine.queues):
            if not any(w.queue == name and w.filter is None for w in self.workers.values()):
                self.subscribe(name, filtered=False)
        for _ in range(budget_steps):
            self.options.p_publish = 0.0
            self.step(faults=False)
            for name in sorted(self.engine.queues):
                if not any(w.queue == name and w.filter is None for w in self.workers.values()):
                    self.subscribe(name, filtered=False)
            if not self.oracle.unfinished():
                return
        raise InvariantError(f"liveness: unfinished after {budget_steps} steps: {self.oracle.unfinished()}")

    def digest(self) -> str:
        return self.trace.hexdigest()

    def work_digest(self) -> str:
        return self.work_trace.hexdigest()


def newest(chosen: list[tuple[int, int]]) -> dict[int, int]:
    """Bookmark -> the newest epoch among ``chosen`` (one redelivered to the same worker)."""
    by_seq: dict[int, int] = {}
    for seq, epoch in chosen:
        by_seq[seq] = max(epoch, by_seq.get(seq, 0))
    return by_seq


def lvq_key(q: Queue, m: R.Message) -> object:
    """A waiting message's last-value key (it was read when the message entered)."""
    assert q.last_values.fn is not None
    return q.last_values.fn(m.headers, m.payload, m.topic)


def run_seed(seed: int, steps: int = 2000) -> Simulator:
    return Simulator(seed, steps).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the zq engine simulator for one seed, or print the trace "
                                                 "digests of a range of seeds (to compare two trees of the core).")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--digests", type=int, nargs=2, metavar=("FIRST", "END"),
                        help="print 'seed digest' for seeds FIRST..END-1: a change meant to keep behaviour "
                             "prints the same lines as the tree before it")
    args = parser.parse_args(argv)
    if args.digests:
        first, end = args.digests
        if not 0 <= first < end or end - first > 10_000 or not 1 <= args.steps <= 1_000_000:
            parser.error("--digests FIRST END: 0 <= FIRST < END, at most 10,000 seeds; --steps 1..1,000,000")
        for seed in range(first, end):
            print(seed, Simulator(seed, args.steps).run().digest(), flush=True)
        return 0
    if args.seed is None:
        parser.error("give --seed N, or --digests FIRST END")
    sim = Simulator(args.seed, args.steps)
    print(f"SEED={args.seed} options={sim.options}")
    try:
        sim.run()
    except InvariantError as exc:
        print(f"FAILED at step {sim.step_no}: {exc}", file=sys.stderr)
        return 1
    print(f"ok: steps={sim.step_no} crashes={sim.crashes} deliveries={sim.oracle.deliveries} "
          f"transactions={sim.transactions} (refused {sim.tx_refused}) trace={sim.digest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["R", "Simulator", "SimOptions", "ZqError", "run_seed"]
