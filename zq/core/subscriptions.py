"""Subscriptions: who consumes which queue, opened and closed; claims (Marconi).

A subscription is a consumer's standing credit on one queue (``backlog``); a claim is
a subscription with no standing credit, given ``limit`` for one answer and closed
again (``end_claim``) once answered. Subscribing to a name no queue has makes a
provisional queue (``zq.core.routing``); a consumer's last subscription ending lets
the engine forget the name it gave itself, once its last events are journaled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import expr, limits
from zq.core.errors import LimitError, ProtocolError, UnknownQueueError, UnknownSubscriptionError
from zq.core.queue import Queue, Subscription
from zq.core.settings import check_queue_name

if TYPE_CHECKING:
    from zq.core.host import Host
    from zq.core.routing import Routes


class Subscriptions:
    """Every open subscription, by id and by consumer."""

    def __init__(self, host: Host, routes: Routes) -> None:
        self.host = host
        self.routes = routes
        self.subs: dict[str, Subscription] = {}
        self.subs_of_consumer: dict[str, set[str]] = {}
        self.subs_made = 0  # numbers subscriptions: deliveries go out in the order they subscribed

    def subscribe(
        self, sub_id: str, queue: str, consumer: str, max_backlog: int, now_ms: int, filter: str | None = None,
        consumer_name: str = "", reclaimable: bool = False,
    ) -> int:
        """Open a subscription; returns its backlog (the credit it gets).

        With ``filter`` (the expression language), the subscription gets only the
        messages it matches, oldest first; the others wait for other subscribers.
        ``reclaimable``: deliveries it has not started may be asked back for a hungry
        subscription (``Reclaimer.plan``; the holder answers with ``release_revoked``).
        """
        self.host.set_time(now_ms)
        check_queue_name(queue)
        match = None
        if filter:
            match = self.host.matcher(expr.compile_filter(filter, self.host.expr_limits))
        if sub_id in self.subs:
            raise ProtocolError(f"subscription id {sub_id!r} is already in use")
        if len(self.subs) >= limits.SUBSCRIPTIONS_MAX:
            raise LimitError(f"too many subscriptions (max {limits.SUBSCRIPTIONS_MAX})")
        q = self.host.queues.get(queue)
        if q is None:
            if not self.routes.auto_queues:
                raise UnknownQueueError(f"no queue named {queue!r}")
            covering = self.routes.route(queue)
            if covering:  # a second queue would get each of these messages too: twice the work
                first = covering[0]
                raise UnknownQueueError(
                    f"no queue named {queue!r}: messages on topic {queue!r} go to queue {first.name!r} (its topics "
                    f"{first.settings.topics!r}); consume {first.name!r} (a filter picks some of them), or create "
                    f"queue {queue!r} explicitly to have a second queue that gets every one of them as well")
            if max_backlog < 1:
                raise ProtocolError(f"max_backlog must be at least 1, got {max_backlog}")
            q = self.host.add_queue(self.routes.auto_settings(queue), declare=False)
            self.routes.provisional.add(queue)
        if max_backlog < 1:
            raise ProtocolError(f"max_backlog must be at least 1, got {max_backlog}")
        if reclaimable and (q.at_most_once or q.browse):
            raise ProtocolError(f"queue {queue!r} is {'browse-only' if q.browse else 'at-most-once'}: its deliveries "
                                "cannot be taken back (reclaimable needs an at-least-once queue)")
        backlog = min(q.settings.max_per_subscription_backlog, max_backlog)
        sub = Subscription(sub_id, q, consumer, backlog, match, filter or None)
        self.subs_made += 1
        sub.ordinal = self.subs_made
        sub.reclaimable = reclaimable
        self.host.touch(q)
        self.subs[sub_id] = sub
        self.subs_of_consumer.setdefault(consumer, set()).add(sub_id)
        if consumer_name:
            self.host.consumer_names[consumer] = consumer_name
        q.add_subscription(sub)
        return backlog

    def claim(
        self,
        sub_id: str,
        queue: str,
        consumer: str,
        limit: int,
        lease_ms: int,
        now_ms: int,
        *,
        destructive: bool = False,
        filter: str | None = None,
        consumer_name: str = "",
    ) -> None:
        """Open a claim (Marconi): up to ``limit`` messages leased for ``lease_ms``.

        The claim's deliveries come out of ``drain`` like any subscription's; the
        adapter ends the claim (``end_claim``) once it has answered. A ``destructive``
        claim removes what it takes (acked in the same step: an at-most-once batch get).
        """
        self.host.set_time(now_ms)
        if not 1 <= limit <= limits.CLAIM_MAX:
            raise ProtocolError(f"claim limit must be 1..{limits.CLAIM_MAX}, got {limit}")
        if not 0 < lease_ms <= limits.DURATION_MS_MAX:
            raise ProtocolError(f"a claim's lease must be 1..{limits.DURATION_MS_MAX} ms")
        match = self.host.matcher(expr.compile_filter(filter, self.host.expr_limits)) if filter else None
        sub = self.subs.get(sub_id)
        if sub is None:
            self.subscribe(sub_id, queue, consumer, 1, now_ms, consumer_name=consumer_name)
            sub = self.subs[sub_id]
            sub.pull = True
            sub.backlog = 0
        elif not sub.pull or sub.queue.name != queue:
            raise ProtocolError(f"subscription {sub_id!r} is not a claim on {queue!r}")
        q = sub.queue
        self.host.touch(q)
        if (match is None) != (sub.match is None):
            q.filtered += 1 if match is not None else -1
        sub.match, sub.filter_text = match, filter or None
        sub.skip_gen = -1  # a new filter judges the set-aside messages afresh
        sub.lease_ms = lease_ms
        sub.destructive = destructive
        sub.backlog = sub.used + limit
        q.credit_opened(sub)

    def end_claim(self, sub_id: str) -> None:
        """The claim was answered (or timed out): no more credit until the next one."""
        sub = self.subs.get(sub_id)
        if sub is not None and sub.pull:
            sub.backlog = sub.used
            self.host.touch(sub.queue)

    def sub(self, sub_id: str) -> Subscription:
        """The subscription ``sub_id``, for a change to it or its queue: this step visits
        the queue."""
        s = self.subs.get(sub_id)
        if s is None:
            raise UnknownSubscriptionError(f"no subscription {sub_id!r}")
        self.host.touch(s.queue)
        return s

    def unsubscribe(self, sub_id: str, now_ms: int, detached: bool = False) -> None:
        """End a subscription; its leased messages return to the queue in order.
        ``detached``: already taken out of its queue's list (``disconnect``)."""
        self.host.set_time(now_ms)
        sub = self.sub(sub_id)
        del self.subs[sub_id]
        ids = self.subs_of_consumer.get(sub.consumer)
        if ids is not None:
            ids.discard(sub_id)
            if not ids:
                del self.subs_of_consumer[sub.consumer]
                if sub.consumer in self.host.consumer_names:  # kept until its last events are out (drain)
                    self.host.names_to_forget.append(sub.consumer)
        sub.queue.remove_subscription(sub, self.host.now_ms, detached)
        if self.routes.provisional:
            self.routes.forget_provisional(sub.queue)

    def disconnect(self, consumer: str, now_ms: int) -> None:
        """A consumer is gone: every subscription of it ends, leases break at once.
        Its subscriptions leave each queue's list in one pass, not one scan each."""
        ids = sorted(self.subs_of_consumer.get(consumer, ()))
        by_queue: dict[Queue, set[Subscription]] = {}
        for sub_id in ids:
            sub = self.subs[sub_id]
            by_queue.setdefault(sub.queue, set()).add(sub)
        for q, gone in by_queue.items():
            q.detach(gone)
        for sub_id in ids:
            self.unsubscribe(sub_id, now_ms, detached=True)

