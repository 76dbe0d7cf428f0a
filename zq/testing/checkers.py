"""Invariant checkers for the engine, fed from the committed journal stream.

``Oracle`` keeps its own account of what happened, built only from what became
durable (committed records) and what the simulator itself published, and checks
the safety properties zq promises after every step:

* no acknowledged message is ever delivered again;
* nothing vanishes: every confirmed message is acked, expired, waiting or leased;
* no subscription holds more than its backlog (and the engine agrees on the count);
* a sequenced group is never out at two consumers at once (its holder may take several,
  up to its credit), and goes in publish order; a one-in-flight group never has two
  messages out at once;
* an exclusive group is never split across live consumers, and goes in order;
* a queue with a target depth never holds more than that many messages in memory,
  and every message it does not hold is in its journal-only part;
* a delayed message (a retry's backoff, a publish's delay) is not delivered before the
  time its ``delayed`` event names;
* every message's account of unfinished deliveries by cause (cancelled, failed, lease
  expired, consumer gone) is what its events say, in the engine and on its dead letter;
* reclaiming: a delivery is taken back only from its holder (which gave it back
  unstarted: the simulator checks that), every message's count of such returns is
  what its events say, in the engine and on its dead letter, and a message expires for
  ``max_deliveries`` only after that many deliveries not given back;
* on a queue with ``max_lease_age``, a connected holder's lease does not expire before
  the delivery is that old;
* in a priority or sorted queue, no message is leased while a better-ranked ungrouped
  message waits (checked per step, for queues without content-filtered subscribers);
* in a fair queue (tenants), no tenant is starved of its share: while a tenant has a
  *fresh* message waiting (never delivered, in no group), each other tenant gets at
  most ``ceil(w_other / w_tenant) + 1`` first deliveries of fresh messages before the
  tenant is served again, plus that much again for each place its own older messages
  hold (waiting in a group, delayed, returned; or several of its places served in one
  step), plus ``priority_aging * 10 * w_other`` with aging; with strict priority,
  counted within a level. A step counts as one moment (its events are grouped by
  consumer, not in dispatch order). Left out: queues with content-filtered
  subscribers, and a tenant that lost a place unserved (a message expired, purged or
  replaced before delivery still took its place in the order) until the next restart;
* poison: a message a queue cannot evaluate (its last-value key, priority or sort key
  raise ``Unevaluable`` on its body) is set aside in the step it entered (an ``expired``
  event with reason ``poison``, the error named), never delivered; a message the queue
  can evaluate is never set aside;
* the engine's own structures agree with each other (``check_engine``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from zq.core import inventory
from zq.core import records as R
from zq.core.leases import G_SHIFT
from zq.core.engine import Engine
from zq.core.expr import Unevaluable
from zq.core.ordering import priority_of
from zq.core.queue import Queue
from zq.core.settings import QueueSettings


class InvariantError(AssertionError):
    pass


@dataclass
class QueueView:
    semantics: str
    group_policy: str
    confirmed: dict[int, str | None] = field(default_factory=dict)  # seq -> group
    open: set[int] = field(default_factory=set)  # confirmed and not finished
    group_open: dict[str, set[int]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    held: dict[int, str] = field(default_factory=dict)  # seq -> consumer holding it
    delivered_once: set[int] = field(default_factory=set)
    barriers: set[int] = field(default_factory=set)  # barrier messages not yet released
    browse: bool = False  # browse_only: nothing is leased, messages stay until they expire
    ranks: dict[int, int] = field(default_factory=dict)  # ordered queues: seq -> rank
    due: dict[int, int] = field(default_factory=dict)  # delayed: seq -> not before (ms)
    max_lease_age_ms: int = 0  # leases of connected holders renew until a delivery is this old
    leased_at: dict[int, int] = field(default_factory=dict)  # seq -> when its live delivery began
    causes: dict[int, list[int]] = field(default_factory=dict)  # seq -> [cancelled, failed, expired, gone]
    reclaims: dict[int, int] = field(default_factory=dict)  # seq -> deliveries given back unstarted
    max_deliveries: int = 0  # a message expires for it only after this many counted (not given back) deliveries
    tqd: bool = False  # messages read back in from the journal after a restart lose their accounts
    fair: "FairView | None" = None  # tenants: what the fair-share bound is checked against
    poison: set[int] = field(default_factory=set)  # entered this step, content unevaluable: must be set aside


@dataclass
class FairView:
    """A fair queue's messages by share (tenant, and priority level under strict
    priority), and for each share how many first deliveries of other shares' fresh
    messages (never delivered, never delayed, in no group) it has seen since its last."""
    settings: QueueSettings
    fresh: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    share_of: dict[int, tuple[str, int]] = field(default_factory=dict)  # fresh ones
    member: dict[int, tuple[str, int]] = field(default_factory=dict)  # every message's share, until finished
    members: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    overtaken: dict[tuple[str, int], int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # every tenant that had a message here
    step: list[tuple[tuple[str, int] | None, tuple[str, int] | None]] = field(default_factory=list)
    tainted: set[tuple[str, int]] = field(default_factory=set)  # shares that lost a place unserved
    delivered: set[int] = field(default_factory=set)  # members delivered at least once
    most: int = 0  # the largest count seen, in % of its bound (the check ran on real cases)

    def weight(self, tenant: str) -> int:
        return self.settings.tenant_weights.get(tenant, self.settings.tenant_default_weight)

    def add(self, seq: int, tenant: str, priority: int, fresh: bool) -> None:
        """A message entered; ``fresh`` unless it is in a group (or a copy)."""
        strict = bool(self.settings.priority) and not self.settings.priority_aging
        share = (tenant, priority if strict else 0)
        self.seen.add(tenant)
        self.member[seq] = share
        self.members.setdefault(share, set()).add(seq)
        if fresh:
            self.fresh.setdefault(share, set()).add(seq)
            self.share_of[seq] = share

    def drop(self, seq: int, served: bool = False) -> tuple[str, int] | None:
        """It is no longer fresh. Unless it was delivered (``served``), it left without
        its turn (expired, purged, replaced, delayed) yet took its place in its tenant's
        order, a place whose time may still be ahead: the tenant's wait is not bounded by
        the counts here any more, and it is left out until a restart re-tags the queue."""
        share = self.share_of.pop(seq, None)
        if share is not None:
            members = self.fresh[share]
            members.discard(seq)
            if not served:
                self.tainted.add(share)
            if not members:
                del self.fresh[share]
        return share

    def finished(self, seq: int) -> None:
        self.drop(seq)
        share = self.member.pop(seq, None)
        if share is not None:
            self.members[share].discard(seq)
            if seq not in self.delivered:
                self.tainted.add(share)  # (one that waited in a group or for its time, then expired)
        self.delivered.discard(seq)

    def per_tag(self, share: tuple[str, int]) -> int:
        """What the others may take for one place in this share's order."""
        w = self.weight(share[0])
        return sum(-(-self.weight(u) // w) for u in self.seen if u != share[0])

    def bound(self, share: tuple[str, int], held: dict[int, str]) -> int:
        """The first deliveries others may get before this share's next: their shares of
        one place (plus aging), and of each place its own waiting messages that are not
        fresh (in a group, delayed, returned) hold ahead of its oldest fresh one."""
        w = self.weight(share[0])
        aging = self.settings.priority_aging * (PRIORITY_SPREAD if self.settings.priority else 0)
        head = min(self.fresh[share])
        ahead = sum(1 for m in self.members[share] if m < head and m not in self.share_of and m not in held)
        return sum(-(-self.weight(u) // w) + 1 + aging * self.weight(u)
                   for u in self.seen if u != share[0]) + ahead * self.per_tag(share)

    def leased(self, seq: int) -> None:
        """Delivered in this step (counted at its end: a step's events are grouped by
        consumer, not in the order the dispatcher went)."""
        self.delivered.add(seq)
        self.step.append((self.member.get(seq), self.drop(seq, served=True)))

    def end_step(self, queue: str, unfiltered: bool, held: dict[int, str]) -> None:
        """A share served in the step has had its turn; every other share with fresh
        messages waiting counts the step's first deliveries of its rivals."""
        step, self.step = self.step, []
        served = Counter(share for share, _ in step if share is not None)
        for share, times in served.items():
            # Its turn (a redelivery too: a restart re-tags them). Several of its places
            # went at once: the others are owed their shares of each before its next.
            self.overtaken[share] = -(times - 1) * self.per_tag(share)
        if not unfiltered:
            self.overtaken.clear()  # a filter may refuse a tenant's messages: no share is owed
            return
        for _, share in step:
            if share is None:
                continue
            for other in self.fresh:
                if other in served or other in self.tainted or other[0] == share[0] or other[1] != share[1]:
                    continue  # (strict priority: another level is not this share's rival)
                n = self.overtaken.get(other, 0) + 1
                self.overtaken[other] = n
                limit = self.bound(other, held)
                self.most = max(self.most, n * 100 // max(limit, 1))
                if n > limit:
                    raise InvariantError(f"{queue}: tenant {other[0]!r} starved: {n} first deliveries of other "
                                         f"tenants since its last, over its bound {limit}, while "
                                         f"{sorted(self.fresh[other])[:5]} wait (weights {self.settings.tenant_weights})")


PRIORITY_SPREAD = 10  # the simulator's largest priority minus its smallest


def unevaluable(q: Queue, m: R.Message) -> bool:
    """Does the queue's judgment of an entering message (``entering.judge``) fail on it?"""
    try:
        for fn in (q.last_values.fn, q.priority_fn, q.level_fn):
            if fn is not None:
                fn(m.headers, m.payload, m.topic)
    except Unevaluable:
        return True
    return False


class Oracle:
    def __init__(self) -> None:
        self.queues: dict[str, QueueView] = {}
        self.deliveries = 0
        self.step_leased: dict[str, list[int]] = {}

    def queue_view(self, q: Queue) -> QueueView:
        view = self.queues.get(q.name)
        if view is None:
            view = self.queues[q.name] = QueueView(q.settings.semantics, q.settings.group_policy,
                                                   browse=q.settings.browse_only,
                                                   max_lease_age_ms=q.settings.max_lease_age_ms,
                                                   max_deliveries=q.settings.max_deliveries,
                                                   tqd=bool(q.settings.target_queue_depth),
                                                   fair=FairView(q.settings) if q.settings.tenant_header else None)
        return view

    # ------------------------------------------------------------ feeding

    def committed(self, engine: Engine, records: list[object]) -> None:
        """Account for one committed step, in record order."""
        self.step_leased = {}
        for rec in records:
            if type(rec) is R.Message:
                self.on_message(engine, rec)
            elif type(rec) is R.Event:
                self.on_event(engine, rec)
        for name, view in self.queues.items():
            if view.poison:
                raise InvariantError(f"{name}: {sorted(view.poison)[:5]} cannot be evaluated but were not set aside "
                                     "as poison in the step they entered")
        for name, leased in self.step_leased.items():
            self.check_rank_order(engine, name, leased)
        for name, view in self.queues.items():
            if view.fair is not None and view.fair.step:
                q = engine.queues.get(name)
                view.fair.end_step(name, q is not None and not q.filtered, view.held)

    def check_rank_order(self, engine: Engine, name: str, leased: list[int]) -> None:
        """Every message leased this step ranks no worse than any ungrouped one still waiting."""
        view, q = self.queues[name], engine.queues.get(name)
        if q is None or not q.ordered or q.filtered:
            return
        out = set(leased)
        now = engine.now_ms  # a message waiting for its time is not eligible yet
        waiting = [view.ranks[s] for s in view.open
                   if s not in view.held and s not in out and view.confirmed.get(s) is None and s in view.ranks
                   and view.due.get(s, 0) <= now]
        if not waiting:
            return
        best_waiting = min(waiting)
        worst_leased = max(view.ranks[s] for s in leased if s in view.ranks)
        if worst_leased > best_waiting:
            raise InvariantError(f"{name}: priority inverted: {worst_leased & (2**64 - 1)} leased while "
                                 f"better-ranked {best_waiting & (2**64 - 1)} waits")

    def on_message(self, engine: Engine, msg: R.Message) -> None:
        for q in engine.route(msg.topic):
            if msg.seq < q.settings.start_seq:
                continue
            if q.filter is not None:
                content = engine.message(msg.seq) or msg
                if not q.filter(content.headers, content.payload, content.topic):
                    continue
            view = self.queue_view(q)
            self.check_dead_letter(msg)
            if (q.ordered or q.last_values.fn is not None) and unevaluable(q, engine.message(msg.seq) or msg):
                view.confirmed[msg.seq] = None
                view.open.add(msg.seq)
                view.poison.add(msg.seq)  # its ``expired`` event must follow in this step
                continue
            if q.barrier.fn is not None:
                content = engine.message(msg.seq) or msg
                if q.barrier.fn(content.headers, content.payload, content.topic):
                    view.barriers.add(msg.seq)
            group = None
            if q.grouped:
                group = msg.headers.get(q.settings.group_header or "")
                if msg.copy_of is not None:
                    group = None  # dead letter: group decided by the engine, not checked here
            view.confirmed[msg.seq] = group
            view.open.add(msg.seq)
            if view.fair is not None:
                content = engine.message(msg.seq) or msg
                p = priority_of(q.priority_fn(content.headers, content.payload, content.topic)) if q.priority_fn else 0
                fresh = msg.copy_of is None and not (q.grouped and msg.headers.get(q.settings.group_header or ""))
                view.fair.add(msg.seq, content.headers.get(q.settings.tenant_header or "", ""), p, fresh)
            if q.level_fn is not None:
                content = engine.message(msg.seq) or msg
                view.ranks[msg.seq] = (q.level_fn(content.headers, content.payload, content.topic) << 64) | msg.seq
            if group is not None:
                view.group_open.setdefault(group, set()).add(msg.seq)

    def check_dead_letter(self, msg: R.Message) -> None:
        """A dead letter carries its original's account by cause, and how often it was
        taken back unstarted, as the events told them."""
        if msg.copy_of is None or "zq.reason" not in msg.headers:
            return
        view = self.queues.get(msg.headers.get("zq.queue", ""))
        if view is None or view.tqd:
            return
        if "zq.cancelled" in msg.headers:
            want = view.causes.get(msg.copy_of, [0, 0, 0, 0])
            got = [int(msg.headers[k]) for k in ("zq.cancelled", "zq.failed", "zq.lease_expired", "zq.consumer_gone")]
            if got != want:
                raise InvariantError(f"dead letter of {msg.copy_of} says causes {got}, its events say {want}")
        if int(msg.headers.get("zq.reclaimed", 0)) != view.reclaims.get(msg.copy_of, 0):
            raise InvariantError(f"dead letter of {msg.copy_of} says it was taken back {msg.headers.get('zq.reclaimed')} "
                                 f"times, its events say {view.reclaims.get(msg.copy_of, 0)}")

    def on_event(self, engine: Engine, ev: R.Event) -> None:
        view = self.queues.get(ev.queue)
        if view is None:
            q = engine.queues.get(ev.queue)
            if q is None:
                return
            view = self.queue_view(q)
        kind = ev.kind
        if kind == R.EXPIRED and ev.reason == R.REASON_POISON:
            if len(ev.errors) != len(ev.bookmarks) or not all(ev.errors):
                raise InvariantError(f"{ev.queue}: poison {ev.bookmarks} set aside without its errors: {ev.errors}")
            for seq in ev.bookmarks:
                if seq not in view.poison:
                    raise InvariantError(f"{ev.queue}: {seq} set aside as poison, yet the queue can evaluate it "
                                         "(or it was not entering)")
                view.poison.discard(seq)
        for seq in ev.bookmarks:
            if kind == R.LEASED:
                if view.fair is not None:  # (first: at-most-once finishes the message as it is leased)
                    view.fair.leased(seq)
                self.on_leased(view, ev, seq)
            elif kind == R.ACKED:
                view.held.pop(seq, None)
                view.acked.add(seq)
                self.finish(view, seq)
            elif kind == R.EXPIRED:
                if ev.reason == R.REASON_BARRIER:
                    if view.barriers and min(view.barriers) != seq:
                        raise InvariantError(f"{ev.queue}: barrier {seq} released before barrier {min(view.barriers)}")
                    if any(s < seq for s in view.held):
                        raise InvariantError(f"{ev.queue}: barrier {seq} released while earlier messages are out")
                    view.barriers.discard(seq)
                if ev.reason == R.REASON_REQUESTED:
                    view.held.pop(seq, None)  # the holder asked: its lease ends here
                if ev.reason == R.REASON_MAX_DELIVERIES and view.max_deliveries and not view.tqd:
                    counted = dict(zip(ev.bookmarks, ev.deliveries))[seq] - view.reclaims.get(seq, 0)
                    if counted < view.max_deliveries:
                        raise InvariantError(f"{ev.queue}: {seq} expired for max_deliveries={view.max_deliveries} "
                                             f"after {counted} counted deliveries ({view.reclaims.get(seq, 0)} given "
                                             "back unstarted do not count)")
                if seq in view.held and view.semantics == "at-least-once":
                    raise InvariantError(f"{ev.queue}: {seq} expired while still held by {view.held[seq]}")
                self.finish(view, seq)
            elif kind == R.RECLAIMED:
                if view.held.pop(seq, None) != ev.consumer:
                    raise InvariantError(f"{ev.queue}: {seq} taken back from {ev.consumer}, which did not hold it")
                view.leased_at.pop(seq, None)
                view.reclaims[seq] = view.reclaims.get(seq, 0) + 1
            elif kind in (R.CANCELLED, R.LEASE_EXPIRED, R.RETURNED):
                view.held.pop(seq, None)
                if view.semantics == "at-least-once":
                    slot = (1 if ev.reason else 0) if kind == R.CANCELLED else 2 if kind == R.LEASE_EXPIRED else 3
                    view.causes.setdefault(seq, [0, 0, 0, 0])[slot] += 1
                began = view.leased_at.pop(seq, None)
                if kind == R.LEASE_EXPIRED and view.max_lease_age_ms and began is not None \
                        and ev.ts_ms - began < view.max_lease_age_ms:
                    raise InvariantError(f"{ev.queue}: the lease of {seq}, held by connected {ev.consumer}, ended "
                                         f"{ev.ts_ms - began} ms after delivery, before max_lease_age "
                                         f"{view.max_lease_age_ms} ms")
        if kind == R.DELAYED:
            view.due.update(zip(ev.bookmarks, ev.due_ms))
            if view.fair is not None:
                for seq in ev.bookmarks:
                    view.fair.drop(seq, served=True)  # it waits for its time, and keeps its place

    def on_leased(self, view: QueueView, ev: R.Event, seq: int) -> None:
        self.deliveries += 1
        if seq in view.poison:
            raise InvariantError(f"{ev.queue}: {seq} delivered to {ev.consumer}, though it cannot be evaluated")
        if seq in view.acked:
            raise InvariantError(f"{ev.queue}: acked message {seq} delivered again to {ev.consumer}")
        if seq in view.held:
            raise InvariantError(f"{ev.queue}: {seq} leased to {ev.consumer} while held by {view.held[seq]}")
        due = view.due.pop(seq, None)
        if due is not None and ev.ts_ms < due:
            raise InvariantError(f"{ev.queue}: {seq} delivered at {ev.ts_ms}, before its time {due}")
        if seq not in view.confirmed:
            raise InvariantError(f"{ev.queue}: delivered {seq}, which was never confirmed in this queue")
        if view.barriers and min(view.barriers) < seq:
            raise InvariantError(f"{ev.queue}: {seq} delivered before barrier {min(view.barriers)} was released")
        group = view.confirmed[seq]
        if group is not None:
            self.check_group_order(view, ev, seq, group)
        view.held[seq] = ev.consumer
        view.leased_at[seq] = ev.ts_ms
        view.delivered_once.add(seq)
        if view.ranks:
            self.step_leased.setdefault(ev.queue, []).append(seq)
        if view.semantics == "at-most-once":
            self.finish(view, seq)

    @staticmethod
    def finish(view: QueueView, seq: int) -> None:
        if view.fair is not None:
            view.fair.finished(seq)
        view.finished.add(seq)
        view.due.pop(seq, None)
        view.open.discard(seq)
        view.barriers.discard(seq)  # a barrier that expired, was purged or replaced is gone too
        group = view.confirmed.get(seq)
        if group is not None:
            members = view.group_open.get(group)
            if members is not None:
                members.discard(seq)

    def check_group_order(self, view: QueueView, ev: R.Event, seq: int, group: str) -> None:
        # Members still open, plus (at-most-once) delivered ones still held.
        candidates = set(view.group_open.get(group, ())) | {s for s in view.held if view.confirmed.get(s) == group}
        for other in candidates:
            if other == seq:
                continue
            if other in view.held:
                if view.group_policy == "one-in-flight":
                    raise InvariantError(
                        f"{ev.queue}: one-in-flight group {group!r} has {other} out while {seq} is leased"
                    )
                if view.held[other] != ev.consumer:
                    raise InvariantError(
                        f"{ev.queue}: {view.group_policy} group {group!r} split: {other} at {view.held[other]}, "
                        f"{seq} to {ev.consumer}"
                    )
            if other < seq and other not in view.finished and other not in view.held:
                raise InvariantError(f"{ev.queue}: group {group!r} out of order: {seq} leased before {other}")

    def forget_holders(self) -> None:
        """A restart ends every lease: nothing is held any more."""
        for view in self.queues.values():
            view.held.clear()
            view.leased_at.clear()
            if view.fair is not None:
                view.fair.overtaken.clear()  # the restarted queue tags what is left afresh
                view.fair.tainted.clear()
                view.fair.delivered.clear()  # (delivered before the restart: its new place is not yet served)

    # ------------------------------------------------------------ checking

    def check(self, engine: Engine) -> None:
        check_engine(engine)
        for name, view in self.queues.items():
            q = engine.queues.get(name)
            if q is None:
                raise InvariantError(f"queue {name} vanished")
            waiting = inventory.waiting_set(q)
            leased = set(q.lease_of)
            if len(waiting) != q.depth:
                raise InvariantError(f"{name}: depth {q.depth} but {len(waiting)} waiting")
            at_least_once = view.semantics == "at-least-once"
            live = leased if at_least_once else set()
            both = waiting & live
            if both:
                raise InvariantError(f"{name}: {sorted(both)[:5]} both waiting and leased")
            present = waiting | live
            if q.target.limit:
                if q.active() > q.target.limit:
                    raise InvariantError(f"{name}: {q.active()} messages in memory over target_queue_depth {q.target.limit}")
                journal_only = view.open - present
                if len(journal_only) != q.target.inactive or any(s < q.target.cursor for s in journal_only):
                    raise InvariantError(f"{name}: {q.target.inactive} inactive from {q.target.cursor}, but the journal-only "
                                         f"messages are {sorted(journal_only)[:10]}")
                present |= journal_only
            if present != view.open:
                vanished = sorted(view.open - present)[:5]
                stray = sorted(present - view.open)[:5]
                raise InvariantError(
                    f"{name}: confirmed but neither finished, waiting nor leased (vanished): {vanished}; "
                    f"waiting/leased but never confirmed or already finished: {stray}"
                )
            if at_least_once and not view.tqd and not view.browse:
                for seq in present:
                    c = q.causes_of(seq)
                    got = [c.cancelled, c.failed, c.lease_expired, c.consumer_gone] if c is not None else [0, 0, 0, 0]
                    if got != view.causes.get(seq, [0, 0, 0, 0]):
                        raise InvariantError(f"{name}: {seq} has causes {got}, its events say "
                                             f"{view.causes.get(seq, [0, 0, 0, 0])}")
                    if q.reclaiming.given.get(seq, 0) != view.reclaims.get(seq, 0):
                        raise InvariantError(f"{name}: {seq} taken back {q.reclaiming.given.get(seq, 0)} times, its events "
                                             f"say {view.reclaims.get(seq, 0)}")
            held_by: dict[str, int] = {}
            for seq, consumer in view.held.items():
                held_by[consumer] = held_by.get(consumer, 0) + 1
                if seq not in leased:
                    raise InvariantError(f"{name}: {consumer} holds {seq} but the engine has no lease on it")
            for sub in q.subs:
                if sub.used > sub.backlog:
                    raise InvariantError(f"{name}: {sub.sub_id} holds {sub.used} > backlog {sub.backlog}")
                if view.browse:
                    if len(sub.browse_out) != sub.used:
                        raise InvariantError(f"{name}: browser {sub.sub_id} used {sub.used} != {len(sub.browse_out)} out")
                    continue
                if held_by.get(sub.consumer, 0) != sub.used:
                    raise InvariantError(
                        f"{name}: engine says {sub.consumer} holds {sub.used}, journal says {held_by.get(sub.consumer, 0)}"
                    )
            if view.group_policy in ("exclusive", "sequenced"):
                owners: dict[str, set[str]] = {}
                for seq, consumer in view.held.items():
                    g = view.confirmed.get(seq)
                    if g is not None:
                        owners.setdefault(g, set()).add(consumer)
                for g, who in owners.items():
                    if len(who) > 1:
                        raise InvariantError(f"{name}: {view.group_policy} group {g!r} held by {sorted(who)}")

    def unfinished(self) -> dict[str, list[int]]:
        return {name: sorted(view.open) for name, view in self.queues.items() if view.open and not view.browse}


def check_engine(engine: Engine) -> None:
    """Structural agreement inside the engine (cheap enough for every step)."""
    for q in engine.queues.values():
        used = {s.sub_id: 0 for s in q.subs}
        for seq, lease in q.lease_of.items():
            if lease.sub.sub_id not in used:
                raise InvariantError(f"{q.name}: {seq} leased to a dead subscription {lease.sub.sub_id}")
            used[lease.sub.sub_id] += 1
            if seq not in q.meta:
                raise InvariantError(f"{q.name}: leased {seq} has no delivery counters")
        for s in q.subs:
            held = len(s.browse_out) if q.browse else used[s.sub_id]  # browsers hold credit, not leases
            if held != s.used:
                raise InvariantError(f"{q.name}: {s.sub_id} used={s.used} but holds {held} leases")
            if engine.subs.get(s.sub_id) is not s:
                raise InvariantError(f"{q.name}: subscription {s.sub_id} unknown to the engine")
        inflight: dict[int, int] = {}
        holders: dict[int, set[str]] = {}
        for seq, lease in q.lease_of.items():
            gid = q.meta[seq] >> G_SHIFT
            if gid:
                inflight[gid] = inflight.get(gid, 0) + 1
                holders.setdefault(gid, set()).add(lease.sub.sub_id)
        for gid, grp in q.groups.items():
            if grp.inflight != inflight.get(gid, 0):
                raise InvariantError(f"{q.name}: group {grp.name} inflight={grp.inflight}, leases say {inflight.get(gid, 0)}")
            if not q.owned and grp.inflight > 1:
                raise InvariantError(f"{q.name}: one-in-flight group {grp.name} has {grp.inflight} in flight")
            if q.owned and grp.inflight and (grp.owner is None or holders[gid] != {grp.owner.sub_id}):
                raise InvariantError(f"{q.name}: group {grp.name} leased to {sorted(holders[gid])}, "
                                     f"holder {grp.owner.sub_id if grp.owner else None}")
            if q.held_while_busy and grp.owner is not None and not grp.inflight:
                raise InvariantError(f"{q.name}: sequenced group {grp.name} has a holder that holds none of it")
            pending = list(grp.pending[grp.phead:])
            if pending != sorted(pending):
                raise InvariantError(f"{q.name}: group {grp.name} pending out of order")
            if grp.owner is not None and grp.owner not in q.subs:
                raise InvariantError(f"{q.name}: group {grp.name} owned by a dead subscription")
