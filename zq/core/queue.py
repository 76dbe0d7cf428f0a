"""One queue: its waiting messages, its subscriptions, its leases, and dispatch.

Theory of operation
-------------------
A queue holds *sequence numbers*, never payloads (those live in the journal). A
waiting message sits in exactly one of these ordered places:

* ``fifo`` -- an ``array('Q')`` of sequence numbers in publish order with a parallel
  ``array('I')`` of interned group ids (0 = ungrouped), consumed from ``head``.
  New messages always append here; 12 bytes per queued message.
* ``returned`` -- a heap of ungrouped sequence numbers that came back (cancel,
  lease expiry, a consumer's death). Returned messages keep their original place:
  dispatch always takes the smallest sequence number across the three places.
* a group's ``pending`` array -- messages of a group that could not go yet (a
  sequenced group with one in flight, an exclusive group whose owner is full), in
  order. A group that has pending messages and could go now has an entry in the
  ``ready`` heap keyed by its oldest pending sequence number.
* the *set-aside* list -- with content-filtered subscriptions: messages every
  subscription with credit refused by filter, waiting for one that takes them, each
  filtered subscription with a cursor into the list (``zq.core.aside``). A set-aside
  group message *holds* its group (``Group.held``): the group's later messages wait
  behind it, keeping group order.

Priority and sorted queues (``ordered``) use the same places keyed by *rank* instead
of sequence number (``zq.core.ordering``: one int, ``(level << 64) | seq``): every
ungrouped waiting message sits in the ``returned`` heap (the fifo stays empty), a
grouped one waits in its group's pending array in publish order, and the group's head
competes in ``ready`` by its rank. ``ranks`` remembers the rank of messages outside
the heap (parked, set aside, leased), so they come back to the same place.

Dispatch repeatedly looks at the oldest (best-ranked) candidate of the three places. A grouped
message whose group cannot go is *parked* in its group's pending array, so a busy
group never blocks the messages behind it (Qpid: groups never block each other).

A delivery is a *lease*. Leases are kept per delivered batch (one ``Lease`` per
subscription per engine step), not per message; ``lease_of`` maps a leased sequence
number to its lease. Lease deadlines of one queue grow monotonically (constant
lease period, monotonic time), so expiry walks a deque from the front; extended
leases, whose deadlines are arbitrary, go to a small heap: both are ``LeaseClock``'s.

Delayed messages (a retry's backoff, a publish's delay) wait in their usual places and
are marked (seq -> due ms) with a timer each (``DelayTimer``). Dispatch
moves a marked message it meets into its group's pending list (where, as the group's
head, it *parks* the group: that group waits, no other does) or, ungrouped, into
``sleeping``; ``advance`` wakes it at its due time, back into its original place.

Per-message counters (deliveries, cancels, group) exist only for messages that have
been delivered at least once, packed into one int in ``meta``.

Expiration never stores a timestamp per message: sequence numbers grow with time,
so the engine keeps a time index (ms -> first sequence number published at or after
it) and a message is too old exactly when its sequence number is at or below the
queue's *expired watermark* (``zq.core.expiry``).

The queue coordinates parts that each own one idea (docs/architecture.md, "A queue's
parts"): entering (``zq.core.entering``), leases (``leases``), settles (``settling``),
groups (``grouping``), the choice of subscription (``choosing``), the set-aside list
(``aside``), delays (``delaying``), expiry (``expiry``), removal (``removal``), size
limits and last values (``overflow``), barriers (``barriers``), reclaiming
(``reclaim``), browsing (``browse``), target depth (``depth``), causes (``causes``) and
the read-only views (``inventory``). Dispatch and the waiting places stay here: they
are the hot path, and every part reads them.
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING, Final

from zq.core import browse, choosing, delaying, entering, expiry, grouping, inventory, leases, limits, removal, settling
from zq.core import records as R
from zq.core.aside import SetAside
from zq.core.barriers import Barriers
from zq.core.causes import CauseLedger, Causes
from zq.core.deadlines import Deadlines
from zq.core.delaying import DelayTimer
from zq.core.depth import TargetDepth
from zq.core.errors import LimitError
from zq.core.expr import compile_filter
from zq.core.grouping import Group
from zq.core.leases import C_ONE, C_SHIFT, D_MASK, G_SHIFT, Lease, LeaseClock
from zq.core.ordering import NO_RANK, SEQ_MASK
from zq.core.overflow import LastValues, Overflow
from zq.core.reclaim import Reclaimer
from zq.core.regex import compile_pattern
from zq.core.settings import QueueSettings
from zq.core.settling import RecentlyDead

if TYPE_CHECKING:
    from collections.abc import Callable

_COMPACT_MIN = 4096  # compact the fifo array once this many consumed slots lead it
_GO_ON: Final = 0  # what a dispatch step says to do next: go on, or stop
_STOP: Final = 1


class Subscription:
    """One subscriber's window on one queue: credit (``backlog``) and what it holds."""

    __slots__ = (
        "sub_id", "queue", "consumer", "backlog", "used", "leases", "current",
        "out_seqs", "out_deliveries", "waiting_groups", "owned_groups", "acked", "busy_ms",
        "match", "filter_text", "skip_cursor", "skip_gen", "pull", "lease_ms", "destructive", "barrier_out",
        "browse_cursor", "browse_out", "reclaimable", "revoking", "kept", "held_back", "given_back", "ordinal",
    )

    def __init__(self, sub_id: str, queue: "Queue", consumer: str, backlog: int,
                 match: Callable[[int], bool] | None = None, filter_text: str | None = None) -> None:
        self.sub_id = sub_id
        self.queue = queue
        self.consumer = consumer
        self.ordinal = 0  # its place in the engine's order of subscriptions (Subscriptions.subscribe)
        self.backlog = backlog
        self.used = 0
        self.leases: list[Lease] = []
        self.current: Lease | None = None  # the lease of this engine step's deliveries
        self.out_seqs: list[int] = []
        self.out_deliveries: list[int] = []
        self.waiting_groups: set[int] = set()  # exclusive groups parked for our credit
        self.owned_groups: set[int] = set()
        self.acked = 0
        self.busy_ms = 0  # summed delivery -> ack time of its acked messages
        self.match = match  # content filter: seq -> does it match? (None: everything)
        self.filter_text = filter_text
        self.skip_cursor = queue.key_floor  # set-aside entries below this were judged (zq.core.aside)
        self.skip_gen = -1
        # Pull (claim) subscriptions have credit only while a claim is open: ``backlog``
        # is ``used`` plus what the open claim still wants, and settling keeps it so.
        self.pull = False
        self.lease_ms: int | None = None  # a claim's own lease period (None: the queue's)
        self.destructive = False  # the open claim removes what it takes (batch get)
        self.barrier_out: list[int] = []  # barrier messages to send (no lease, no credit)
        self.browse_cursor = 0  # browse_only queues: every message below this was offered
        self.browse_out: set[int] = set()  # browse_only: sent, not yet settled (credit only)
        # Reclaiming (zq.core.reclaim): its unstarted deliveries may be asked back.
        self.reclaimable = False
        self.revoking: dict[int, int] = {}  # seq -> epoch: asked back, no answer yet
        self.kept: dict[int, int] = {}  # seq -> epoch: asked back, already started (not to ask again)
        self.held_back = 0  # credit given back with reclaimed deliveries, withheld until the others took them
        self.given_back = 0  # deliveries it gave back unstarted (stats: zq top's consumers)


class Queue:
    """State and dispatch of one queue; the engine routes inputs to it."""

    def __init__(self, settings: QueueSettings) -> None:
        s = settings
        self.settings = s
        self.name = s.name
        self.topic_re = compile_pattern(s.topics) if s.topics is not None else None
        self.at_most_once = s.semantics == "at-most-once"
        self.fairness = s.effective_fairness()
        self.exclusive, self.owned, self.held_while_busy = grouping.policy(s.group_policy)
        self.grouped = bool(s.group_header) and not s.browse_only  # browsers ignore groups: nothing is leased
        self.filter = compile_filter(s.filter).fn if s.filter else None  # (headers, payload, topic) -> bool
        self.overflow = Overflow(self, s)  # max_depth / max_bytes (zq.core.overflow)
        self.last_values = LastValues(self, s)  # a last-value queue's newest of each key
        self.barrier = Barriers(self, s)  # messages that wait for every earlier one's ack (zq.core.barriers)
        self.browse = s.browse_only
        # Priority, sorted and fair queues rank waiting messages (zq.core.entering.ranking).
        self.level_fn, self.priority_fn, self.fair_share = entering.ranking(s)
        self.ordered = self.level_fn is not None or self.fair_share is not None
        self.ranks: dict[int, int] = {}  # ordered: the rank of each message outside the heap
        self.heap_oldest: int | None = None  # ordered: oldest seq in the heap (None: unknown)
        self.key_floor = -(1 << 400) if self.ordered else -1  # below every rank
        self.target = TargetDepth(self, s.target_queue_depth)  # TargetQueueDepth (zq.core.depth)
        self.fifo = array("Q")
        self.fifo_gid = array("I")
        self.head = 0
        self.returned: list[int] = []
        self.groups: dict[int, Group] = {}
        self.gid_of: dict[str, int] = {}
        self.next_gid = 1
        self.ready: list[tuple[int, int]] = []
        self.meta: dict[int, int] = {}
        self.lease_of: dict[int, Lease] = {}
        self.lease_clock = LeaseClock()
        self.removed: set[int] = set()  # available messages taken out of place (ack-unleased)
        self.removed_gid: dict[int, int] = {}  # removed ones whose group already stopped counting them
        self.subs: list[Subscription] = []
        self.filtered = 0  # subscriptions with a content filter
        self.matches = 0  # filter evaluations of the dispatch under way, against the step's budget
        self.out_of_budget = False  # the last dispatch stopped at its budget: the next step goes on
        self.offered = 0  # the dispatch under way: set-aside messages ranked below this were offered
        self.aside = SetAside(self)  # messages no subscription with credit would take (filters)
        self.rr_next = 0
        self.depth = 0  # available messages
        self.expired_watermark = -1  # seq <= this is older than expiration_ms
        # Where the engine finds this queue's work without searching for it (Engine.touch,
        # Engine.schedule): its place in the order of queues, whether this step visits it,
        # the deadline it waits for in the engine's heap (-1: none), when it last advanced.
        self.ordinal = 0
        self.touched = False
        self.scheduled_ms = -1
        self.advanced_ms = -1
        self.rp = 0  # its recovery point when last computed (Engine.write_recovery_points)
        self.rp_pending = False  # visited since: its recovery point is computed at the next interval
        self.group_sweep_due_ms = 0
        # What this step produced, collected by the engine.
        self.expired_out: list[tuple[int, str, int, str | None]] = []  # seq, reason, deliveries, group
        self.events_out: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
        self.dirty = False
        # Counters for stats.
        self.published = self.delivered = self.acked = self.cancelled = 0
        self.expired = self.dead_lettered = self.redelivered = 0
        self.lost_settles = 0  # fenced settles not applied: their delivery was no longer live
        self.transactions = 0  # settle-and-publish transactions of this queue's deliveries: committed
        self.transactions_refused = 0  # ... not applied (an input not live; an output refused)
        # Poison (``entering.judge``): messages whose content the queue could not evaluate, set aside.
        self.poisoned = 0
        self.poison_errors: dict[int, str] = {}  # this step's: seq -> why (its event and dead letter carry it)
        # Delays (retry backoff, publish delay): see the module docstring.
        self.delays = DelayTimer()
        self.deadlines = Deadlines(self)  # a publish's ttl: the time each message must have gone by
        self.sleeping: set[int] = set()  # ranks of delayed messages of no group that dispatch set aside
        self.delays_out: list[tuple[int, int, int, str]] = []  # this step's: seq, deliveries, due ms, reason
        self.retries_delayed = 0  # returns that waited for the retry schedule (stats)
        self.renewed = 0  # lease renewals of connected holders (max_lease_age; stats)
        self.ledger = CauseLedger(s)  # why deliveries ended unfinished (zq.core.causes)
        self.backoff = s.backoff_ms
        self.ack_latency, self.ack_latency_sum_ms = [0] * 16, 0  # publish -> ack, see timeindex.ACK_LATENCY_BUCKETS_MS
        self.ack_latency_ms: dict[int, int] = {}  # publish -> ack, two significant digits: timeindex.latency_key
        self.reclaiming = Reclaimer(self)  # reclaiming unstarted work (zq.core.reclaim)
        # Moving on from a stuck holder (zq.core.choosing.choose_avoiding): seq -> the consumer
        # whose delivery of it expired or failed, while it waits to go again.
        self.last_holder: dict[int, str] = {}
        self.recently_dead = RecentlyDead()  # what a late settle is told (zq.core.settling)

    def alter(self, s: QueueSettings) -> None:
        """Take new settings on a live queue (``manage.ALTERABLE`` ones only changed)."""
        old = self.settings
        self.settings = s
        self.fairness = s.effective_fairness()
        self.backoff = s.backoff_ms
        self.overflow.configure(s)
        self.ledger.configure(s)
        if self.fair_share is not None:
            self.fair_share.weights = dict(s.tenant_weights)
            self.fair_share.default_weight = s.tenant_default_weight
        if s.lease_ms != old.lease_ms:
            self.lease_clock.period_changed()
            for sub in self.subs:
                sub.current = None
        self.dirty = True  # (a breach that the new limits end, the engine's next step ends)

    # ----------------------------------------------------------------- routing

    def covers(self, topic: str) -> bool:
        if self.topic_re is None:
            return topic == self.name
        return self.topic_re.fullmatch(topic) is not None

    def group_id(self, name: str) -> int:
        """Intern a group name, creating the group; LimitError at the ceiling."""
        gid = self.gid_of.get(name)
        if gid is not None:
            return gid
        if len(self.groups) >= self.settings.max_groups:
            raise LimitError(f"queue {self.name!r} reached max_groups={self.settings.max_groups}")
        gid = self.next_gid
        self.next_gid += 1
        assert gid < 1 << 32, "group id space exhausted"
        self.gid_of[name] = gid
        self.groups[gid] = Group(gid, name)
        return gid

    def can_take_group(self, name: str) -> bool:
        return name in self.gid_of or len(self.groups) < self.settings.max_groups

    def key_of(self, seq: int) -> int:
        """The rank of a message outside the heap (its sequence number in a FIFO queue)."""
        return self.ranks[seq] if self.ordered else seq

    # --------------------------------------------------------------- dispatch

    def dispatch(self, now_ms: int, budget: int = limits.DISPATCH_MATCHES_PER_STEP) -> int:
        """Hand waiting messages to subscriptions with credit, oldest first. Returns the
        filter evaluations it made: at ``budget`` it stops before the next message, still
        dirty (``out_of_budget``), and the next step goes on from there. A message is
        always offered to every subscription with credit before it is set aside.

        Each turn looks at the first candidate of the three places by rank (``NO_RANK``:
        none there) and hands it to the place's own step (``from_fifo``,
        ``from_returned``, ``from_ready``), which says whether to go on (``_GO_ON``) or
        stop (``_STOP``: nobody can take it, the budget is spent, or nothing is left)."""
        self.dirty = False
        self.out_of_budget = False
        self.matches = 0
        if not self.subs or self.depth == 0:
            return 0
        if self.browse:
            browse.dispatch(self, budget)
            return self.matches
        fifo, returned, ready = self.fifo, self.returned, self.ready
        aside = self.aside
        self.offered = self.key_floor  # every live set-aside message ranked below this was offered
        while True:
            f = fifo[self.head] if self.head < len(fifo) else NO_RANK
            r = returned[0] if returned else NO_RANK
            g = ready[0][0] if ready else NO_RANK
            if aside.keys:
                # Set-aside messages older than the next candidate go first, to whoever matches.
                limit = min(f, r, g)
                if limit > self.offered:
                    if aside.has_before(self.offered, limit):
                        aside.offer(limit, now_ms, budget)
                        if self.depth == 0:
                            break
                        if self.matches >= budget:  # (not every set-aside one was offered to everyone)
                            self.stop_for_budget()
                            break
                        self.offered = limit
                        continue  # a set-aside group head went: its group's next may compete now (look again)
                    self.offered = limit
            if self.barrier.waiting:
                held_back = self.barrier.gate(min(f, r, g))
                if held_back is None:
                    continue  # a barrier went out (or a stale one was dropped): look again
                if held_back:
                    break  # the oldest barrier waits for earlier messages to be acknowledged
            if f < r and f < g:
                step = self.from_fifo(f, now_ms, budget)
            elif r < g:
                step = self.from_returned(r, now_ms, budget)
            elif g != NO_RANK:
                step = self.from_ready(now_ms, budget)
            else:
                break
            if step == _STOP:
                break
        self.compact()
        return self.matches

    def from_fifo(self, seq: int, now_ms: int, budget: int) -> int:
        """Dispatch's step for the fifo's head ``seq`` (the oldest candidate)."""
        gid = self.fifo_gid[self.head] if self.grouped else 0
        removed = self.removed
        if removed and seq in removed:
            self.head += 1
            removal.drop_removed(self, seq, gid)
            return _GO_ON
        if seq <= self.expired_watermark:
            self.head += 1
            self.depth -= 1
            self.expire_waiting(seq, gid, R.REASON_EXPIRED)
            return _GO_ON
        grp = self.groups[gid] if gid else None
        if self.delays.due and seq in self.delays.due:
            self.head += 1  # not yet: it waits in its group (parking it) or asleep
            if grp is not None:
                grouping.park(self, grp, seq)
            else:
                self.sleeping.add(seq)
            return _GO_ON
        if grp is not None and (grp.has_pending() or not grouping.can_go(self, grp)):
            self.head += 1
            grouping.park(self, grp, seq)
            return _GO_ON
        filtered = self.filtered
        if filtered and self.matches >= budget:
            self.stop_for_budget()
            return _STOP
        sub = choosing.choose_for(self, grp, seq) if filtered else choosing.choose(self, grp)
        if sub is None:
            if filtered and choosing.any_credit(self):
                self.head += 1
                self.offered = self.aside.add(seq, seq, gid, judged=self.offered >= seq)
                return _GO_ON
            return _STOP
        self.head += 1
        leases.grant(self, sub, seq, grp, now_ms)
        return _STOP if self.depth == 0 else _GO_ON

    def from_returned(self, r: int, now_ms: int, budget: int) -> int:
        """Dispatch's step for the returned heap's top (rank ``r``: the seq itself in a
        FIFO queue), a message of no group."""
        seq = r & SEQ_MASK
        returned, removed = self.returned, self.removed
        if self.delays.due and seq in self.delays.due:
            heapq.heappop(returned)  # a publish's delay (ordered queues enqueue into the heap)
            if seq == self.heap_oldest:
                self.heap_oldest = None
            if self.ordered:
                self.ranks[seq] = r
            self.sleeping.add(r)
            return _GO_ON
        live = not (removed and seq in removed) and seq > self.expired_watermark
        filtered = self.filtered
        sub = None
        if live:
            if filtered and self.matches >= budget:
                self.stop_for_budget()
                return _STOP
            sub = choosing.choose_next(self, None, seq)
            if sub is None and not (filtered and choosing.any_credit(self)):
                return _STOP
        heapq.heappop(returned)
        if seq == self.heap_oldest:
            self.heap_oldest = None
        if not live:
            if seq in removed:
                removal.drop_removed(self, seq, 0)
            else:
                self.depth -= 1
                self.expire_waiting(seq, 0, R.REASON_EXPIRED)
            return _GO_ON
        if self.ordered:
            self.ranks[seq] = r
        if sub is None:
            self.offered = self.aside.add(r, seq, 0, judged=self.offered >= r)
            return _GO_ON
        leases.grant(self, sub, seq, None, now_ms)
        return _STOP if self.depth == 0 else _GO_ON

    def from_ready(self, now_ms: int, budget: int) -> int:
        """Dispatch's step for the head of the group on top of the ``ready`` heap."""
        ready = self.ready
        key, gid = ready[0]
        seq = key & SEQ_MASK
        grp = self.groups.get(gid)
        if grp is None or not grp.has_pending() or grp.pending[grp.phead] != seq:
            heapq.heappop(ready)  # stale entry
            return _GO_ON
        if (self.removed and seq in self.removed) or seq <= self.expired_watermark:
            heapq.heappop(ready)
            grouping.pop_head(self, grp)
            if seq in self.removed:
                removal.drop_removed(self, seq, gid)
            else:
                self.depth -= 1
                self.expire_waiting(seq, gid, R.REASON_EXPIRED)
            if grp.gid in self.groups and grp.has_pending():
                grouping.became_pending(self, grp)  # register the group's new head
            return _GO_ON
        if not grouping.can_go(self, grp):
            heapq.heappop(ready)
            if grp.owner is not None:
                grp.owner.waiting_groups.add(gid)
            return _GO_ON
        filtered = self.filtered
        if filtered and self.matches >= budget:
            self.stop_for_budget()
            return _STOP
        sub = choosing.choose_next(self, grp, seq)
        if sub is None:
            if filtered and choosing.any_credit(self):
                heapq.heappop(ready)
                grouping.pop_head(self, grp)
                self.offered = self.aside.add(key, seq, gid, judged=self.offered >= key)
                return _GO_ON
            return _STOP
        heapq.heappop(ready)
        grouping.pop_head(self, grp)
        leases.grant(self, sub, seq, grp, now_ms)
        if grp.has_pending():
            grouping.became_pending(self, grp)  # register the group's new head
        return _STOP if self.depth == 0 else _GO_ON

    def stop_for_budget(self) -> None:
        """The dispatch spent its filter budget: stay dirty, the next step goes on."""
        self.dirty = True
        self.out_of_budget = True

    def extend(self, sub: Subscription, seqs: list[int], deadline_ms: int) -> list[int]:
        """Move ``seqs`` to leases ending at ``deadline_ms`` (``leases.extend``)."""
        return leases.extend(self, sub, seqs, deadline_ms)

    def mark_delayed(self, seq: int, gid: int, due_ms: int, reason: str, journal: bool = True) -> None:
        """``seq`` may not go before ``due_ms`` (``delaying.mark``)."""
        delaying.mark(self, seq, gid, due_ms, reason, journal)

    def remove_available(self, seq: int, known_waiting: bool = False, gid: int = 0) -> bool:
        """Take a waiting message out (``removal.remove_available``); False if it is not waiting."""
        return removal.remove_available(self, seq, known_waiting, gid)

    # Settles: the engine's ways in (zq.core.settling holds what they do).

    def ack(self, sub: Subscription, seq: int, now_ms: int = 0) -> str | None:
        return settling.ack(self, sub, seq, now_ms)

    def ack_many(self, sub: Subscription, seqs: list[int], now_ms: int = 0, epochs: list[int] | None = None,
                 stale: list[int] | None = None) -> list[int]:
        return settling.ack_many(self, sub, seqs, now_ms, epochs, stale)

    def cancel(self, sub: Subscription, seq: int, now_ms: int = -1, delay_ms: int = -1, error: str = "") -> str | None:
        return settling.cancel(self, sub, seq, now_ms, delay_ms, error)

    def expire_request(self, sub: Subscription, seq: int) -> str | None:
        return settling.expire_request(self, sub, seq)

    def fence(self, sub: Subscription, seqs: list[int], epochs: list[int]) -> tuple[list[int], list[int]]:
        return settling.fence(self, sub, seqs, epochs)

    def settle_result(self, seq: int, next_seq: int) -> str:
        return settling.settle_result(self, seq, next_seq)

    def take_outbox(self, sub: Subscription) -> tuple[list[int], list[int]]:
        seqs, deliveries = sub.out_seqs, sub.out_deliveries
        sub.out_seqs, sub.out_deliveries = [], []
        sub.current = None
        return seqs, deliveries

    def compact(self) -> None:
        if self.head >= _COMPACT_MIN and self.head * 2 >= len(self.fifo):
            del self.fifo[: self.head]
            if self.grouped:
                del self.fifo_gid[: self.head]
            self.head = 0

    # ------------------------------------------------------------ overflow

    def held(self) -> int:
        """Messages in the queue: waiting, leased and inactive (what max_depth counts)."""
        return self.depth + len(self.lease_of) + self.target.inactive

    def active(self) -> int:
        return self.depth + len(self.lease_of)

    # ----------------------------------------------------- ending a delivery

    def credit_opened(self, sub: Subscription) -> None:
        """Exclusive groups parked for ``sub``'s credit may go again (and a subscription
        with new credit may be hungry: reclaiming looks again)."""
        self.reclaiming.seen = ()
        if sub.waiting_groups:
            for gid in sub.waiting_groups:
                grp = self.groups.get(gid)
                if grp is not None and grp.has_pending():
                    grouping.push_ready(self, grp)
            sub.waiting_groups.clear()
        self.dirty = True

    def finish(self, seq: int, gid: int) -> None:
        """The message leaves the queue for good."""
        self.meta.pop(seq, None)
        if self.last_holder:
            self.last_holder.pop(seq, None)
        if self.delays.due:
            self.delays.due.pop(seq, None)
        if self.deadlines.due or self.deadlines.overdue:
            self.deadlines.finished(seq)
        if self.ledger.open:
            self.ledger.finished(seq)
        if self.reclaiming.given:
            self.reclaiming.finished(seq)
        if self.ordered:
            self.ranks.pop(seq, None)
            if self.fair_share is not None:
                self.fair_share.finished(seq)
        self.overflow.forget(seq)
        if self.last_values.key_of:
            self.last_values.finished(seq)
        if gid:
            grp = self.groups[gid]
            grp.count -= 1
            grouping.maybe_forget(self, grp)

    def note_cause(self, seq: int, kind: str, consumer: str, now_ms: int, error: str = "") -> str:
        """Count why a delivery of ``seq`` ended unfinished (``CauseLedger.note``)."""
        return self.ledger.note(seq, kind, consumer, now_ms, error)

    def causes_of(self, seq: int) -> Causes | None:
        return self.ledger.open.get(seq)

    def expire_waiting(self, seq: int, gid: int, reason: str) -> None:
        """Expire a message already taken out of its waiting place."""
        m = self.meta.get(seq, 0)
        name = self.groups[gid].name if gid else None
        self.finish(seq, gid)  # (a delayed one is no longer)
        self.expired_out.append((seq, reason, m & D_MASK, name))
        self.expired += 1

    def note_event(self, kind: str, consumer: str, seq: int, deliveries: int, reason: str = "") -> None:
        key = (kind, consumer, reason)
        batch = self.events_out.get(key)
        if batch is None:
            batch = self.events_out[key] = []
        batch.append((seq, deliveries))

    # -------------------------------------------------------------------- time

    def advance(self, now_ms: int, watermark: int) -> None:
        """Expire leases that ended and messages that grew too old."""
        self.expired_watermark = watermark
        if self.delays.any_due(now_ms):
            delaying.wake_due(self, now_ms)
        clock = self.lease_clock
        lease = clock.pop_due(now_ms)
        while lease is not None:
            expiry.expire_lease(self, lease, now_ms)
            lease = clock.pop_due(now_ms)
        if watermark >= 0 and self.depth:
            expiry.expire_old(self, watermark, now_ms)
        heap = self.deadlines.heap
        if heap and heap[0][0] <= now_ms:
            self.deadlines.expire_due(now_ms)

    def next_deadline_ms(self) -> int | None:
        best = self.lease_clock.next_ms()
        for d in (self.delays.next_ms(), self.deadlines.next_ms()):
            if d is not None:
                best = d if best is None else min(best, d)
        return best

    # ------------------------------------------------------- subscriptions

    def add_subscription(self, sub: Subscription) -> None:
        self.subs.append(sub)
        if sub.match is not None:
            self.filtered += 1
        if sub.reclaimable:
            self.reclaiming.subs += 1
        self.reclaiming.seen = ()
        self.dirty = True

    def detach(self, gone: set[Subscription]) -> None:
        """Take several subscriptions out of ``subs`` in one pass (a session ending with
        a thousand claims on a queue of 100,000 once scanned the list a thousand times);
        each then goes through ``remove_subscription(..., detached=True)``."""
        self.subs = [s for s in self.subs if s not in gone]

    def remove_subscription(self, sub: Subscription, now_ms: int = -1, detached: bool = False) -> None:
        """Break every lease the subscription holds; its messages return in order."""
        if not detached:
            self.subs.remove(sub)
        if sub.match is not None:
            self.filtered -= 1
        if sub.reclaimable:
            self.reclaiming.subs -= 1
        if sub.held_back:
            sub.backlog += sub.held_back
            sub.held_back = 0
        sub.revoking.clear()
        sub.kept.clear()
        self.aside.gen += 1  # groups it owned may go to others now
        for lease in sub.leases:
            if lease.live:
                for seq in lease.seqs:
                    if self.lease_of.get(seq) is lease:
                        settling.end_lease_of(self, seq, R.RETURNED, now_ms)
        sub.leases = []
        for gid in sub.owned_groups:
            grp = self.groups.get(gid)
            if grp is None:
                continue
            grp.owner = None
            if grp.has_pending():
                grouping.push_ready(self, grp)
            grouping.maybe_forget(self, grp)
        sub.owned_groups.clear()
        sub.waiting_groups.clear()
        self.dirty = True

    # --------------------------------------------------------------- counts

    def deliveries_of(self, seq: int) -> int:
        return self.meta.get(seq, 0) & D_MASK

    def counted_deliveries(self, seq: int, m: int) -> int:
        """Deliveries that count against ``max_deliveries``: those given back unstarted
        (reclaimed) do not. (The delivery count itself stays the fence's epoch.)"""
        d = m & D_MASK
        return d - self.reclaiming.given.get(seq, 0) if self.reclaiming.given else d

    def cancels_of(self, seq: int) -> int:
        return (self.meta.get(seq, 0) >> C_SHIFT) & D_MASK

    def group_name_of(self, seq: int) -> str | None:
        gid = self.meta.get(seq, 0) >> G_SHIFT
        grp = self.groups.get(gid) if gid else None
        return grp.name if grp is not None else None

    def restore_causes(self, seq: int, counts: list, error: str, consumer: str) -> None:
        """Recovery: the causes of a message's unfinished deliveries (``CauseLedger.restore``)."""
        self.ledger.restore(seq, counts, error, consumer)

    def restore_counts(self, seq: int, gid: int, deliveries: int, cancels: int) -> None:
        """Recovery: re-create the counters of a message delivered before the crash."""
        if deliveries or cancels:
            self.meta[seq] = (gid << G_SHIFT) | (cancels << 16) | min(deliveries, limits.DELIVERIES_MAX)
