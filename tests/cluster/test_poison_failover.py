"""Poison across a failover (issue #31 §1): three `zq serve` nodes of an elected cluster
(a real ZooKeeper), queues that read content (filter, priority, sort key, last-value
key) in the shared config, ``replicas_ack = 1``. Hostile bodies (zq.testing.bodyfuzz)
and well-formed ones are published to the leader and confirmed; the leader is
SIGKILLed; a standby must be elected and serve: STATS answers, every well-formed message
is delivered, and every confirmed message is delivered, set aside as poison (one dead
letter with ``zq.reason = poison`` and ``zq.error``) or kept out by the queue's filter.
Then more of both are published, the new leader is SIGKILLed too, and the same is
checked on the third leader. A standby that dies recovering a record fails the test
with its log."""

from __future__ import annotations

import json
import os
import socket
import time

import zq
from zq.core.errors import ZqError
from zq.testing.bodyfuzz import BodyFuzz, Case, RawPeer, check_fates

from tests.adapters.support import wait_until

SEED = int(os.environ.get("ZQ_BODY_FUZZ_SEED", "31"))
MAX_MESSAGE = 1024 * 1024  # server.max_message_size of the nodes (the bodies at the limit are this big)
PORTS = range(27300, 27400)  # the nodes' ports (tcp on 127.0.0.1)

QUEUES = {
    "p.filter": {"filter": "/a/b >= 0"},
    "p.prio": {"priority": "/p"},
    "p.sort": {"sort_key": "/k"},
    "p.lvq": {"lvq_key": "/k"},
}
DEAD = {q: f"{q}.dead" for q in QUEUES}
CONTROLS = 4  # well-formed messages per round and topic, each with its own last-value key


def settings() -> str:
    lines = [f'max_message_size = "{MAX_MESSAGE // 1024}KiB"', ""]  # still in [server]
    for name, kw in QUEUES.items():
        lines += ["[[queue]]", f"name = '{name}'", f"topics = '^(px[.]all|{name.replace('.', '[.]')})$'",
                  f"dead_letter = '{DEAD[name]}'", 'lease = "30s"']
        lines += [f"{k} = '{v}'" for k, v in kw.items()] + [""]
    return "\n".join(lines)


def free_ports(n: int) -> list[int]:
    """``n`` ports of PORTS nobody listens on now."""
    out = []
    for port in PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
        if len(out) == n:
            return out
    raise AssertionError(f"fewer than {n} free ports in {PORTS}")


def control(tag: str) -> Case:
    doc = json.dumps({"a": {"b": 1}, "k": tag, "p": 1}).encode()
    return Case(f"control:json:{tag}", doc, {"g": tag}, normal=True)


def publish_round(c, leader: str, rnd: int, problems: list[str]) -> list:  # type: ignore[no-untyped-def]
    """This round's hostile cases and controls, each to px.all and to every queue's own
    topic, one PUBLISH each, on the leader; every one must be answered (else a problem,
    reported at the end: the failover is still worth seeing)."""
    cases = BodyFuzz(SEED, max_message_bytes=MAX_MESSAGE).batch(rnd, hostile=20, normal=0)
    topics = ["px.all", *QUEUES]
    items = [(case, topic, f"r{rnd}.c{i}.{topic}") for i, case in enumerate(cases) for topic in topics]
    # Controls: each its own last-value key (one per topic, so none replaces another).
    items += [(control(f"ctl-{rnd}-{i}-{topic}"), topic, f"r{rnd}.ctl{i}.{topic}") for i in range(CONTROLS)
              for topic in topics]
    peer = RawPeer(c.endpoint(leader), name=f"poison-{rnd}", timeout=30)
    try:
        verdicts = peer.publish(items, timeout=120)
    finally:
        peer.close()
    bad = problems
    for v in verdicts:
        what = f"round {rnd}: PUBLISH {v.tag} ({v.case.label}) to {v.topic}"
        if not v.answered:
            bad.append(f"{what}: no answer within 120 s")
        elif v.code == "internal":
            bad.append(f"{what}: answered internal: {v.message[:200]}")
        elif v.code is not None and v.case.normal:
            bad.append(f"{what}: a well-formed message was refused: {v.code} {v.message[:200]}")
        elif v.code is None and v.case.must_refuse:
            bad.append(f"{what}: confirmed, but it is over a documented limit or has a reserved / non-UTF-8 header")
    return verdicts


def fail_over(c, leader: str, epoch: int, problems: list[str]) -> tuple[str, int]:  # type: ignore[no-untyped-def]
    """SIGKILL the leader; a standby must be elected and keep running; the killed node
    comes back as a standby."""
    c.kill(leader)
    new, new_epoch = c.leader(other_than=leader, epoch_above=epoch, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        dead = [n for n, p in c.procs.items() if p.poll() is not None]
        assert not dead, (f"seed {SEED}: after {leader} was killed, {dead} died (the new leader {new}, epoch "
                          f"{new_epoch}, recovering the journal?)" + earlier(problems) + f"\n{c.tails(40)}")
        try:
            with zq.connect(c.endpoint(new), connect_timeout=2) as client:
                role = client.stats(timeout=5)["server"]["replication"]["cluster"]
            if role.get("role") == "leader" and role.get("serving"):
                break
        except (ZqError, TimeoutError):
            pass  # not serving yet: asked again until the deadline
    else:
        raise AssertionError(f"seed {SEED}: the new leader {new} (epoch {new_epoch}) does not serve STATS within "
                             f"30 s" + earlier(problems) + f"\n{c.tails(40)}")
    c.start(leader)
    return new, new_epoch


def drain(client, q: str, timeout: float = 30.0) -> set[int]:  # type: ignore[no-untyped-def]
    """Take and ack everything the queue gives until STATS says it is empty."""
    got: set[int] = set()
    deadline = time.monotonic() + timeout
    with client.subscribe(q, max_backlog=256, timeout=15) as sub:
        while time.monotonic() < deadline:
            msg = sub.get(0.5)
            if msg is not None:
                got.add(msg.bookmark)
                msg.ack()
                continue
            st = client.stats(timeout=10)["queues"][q]
            if st["depth"] == 0 and st["leased"] == 0:
                return got
    raise AssertionError(f"seed {SEED}: queue {q} still holds messages after {timeout}s of draining "
                         f"({len(got)} taken): {client.stats(timeout=10)['queues'][q]}")


def earlier(problems: list[str]) -> str:
    return f"\n{len(problems)} problems before:\n" + "\n".join(problems[:20]) if problems else ""


def check_leader(c, leader: str, epoch: int, verdicts: list, fresh: list, when: str,  # type: ignore[no-untyped-def]
                 problems: list[str]) -> None:
    """On the new leader: STATS, then each queue drained (this round's well-formed
    messages, ``fresh``, must come), then every confirmed message of every round
    (``verdicts``) accounted for, nothing left waiting."""
    confirmed: dict[str, dict[int, str]] = {q: {} for q in QUEUES}
    for v in verdicts:
        if v.bookmark is not None:
            for q in ([v.topic] if v.topic in QUEUES else QUEUES):
                confirmed[q][v.bookmark] = f"{v.tag} {v.case.label}"
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        st = client.stats(timeout=10)
        rep = st["server"]["replication"]["cluster"]
        assert rep["node"] == leader and rep["epoch"] == epoch, (when, rep)
        if st["server"]["internal_errors"]:
            problems.append(f"{when}: STATS: internal_errors = {st['server']['internal_errors']}")
        for q in QUEUES:
            if "poisoned" not in st["queues"][q]:
                problems.append(f"{when}: STATS of {q} has no 'poisoned' field")
            got = drain(client, q)
            for v in fresh:
                if v.case.normal and v.bookmark is not None and v.topic in ("px.all", q) and v.bookmark not in got:
                    fates = check_fates(client, {q: {"filter": "filter" in QUEUES[q], "dead_letter": DEAD[q]}},
                                        {q: {v.bookmark: v.tag}}, when)
                    problems.append(f"{when}: the well-formed {v.tag} (bookmark {v.bookmark}) was not delivered "
                                    f"from {q} by {leader}: {fates.line()} {fates.problems}")
        fates = check_fates(client, {q: {"filter": "filter" in kw, "dead_letter": DEAD[q]} for q, kw in QUEUES.items()},
                            confirmed, when, well_formed={v.bookmark for v in verdicts if v.case.normal and v.bookmark})
        problems += fates.problems
        print(f"{when}: {fates.line()}")
        for q, counts in fates.counts.items():
            for fate in ("waiting", "leased"):
                if counts.get(fate):
                    problems.append(f"{when}: {counts[fate]} confirmed messages of {q} still {fate} after the drain")
        errors = client.stats(timeout=10)["server"]["internal_errors"]
        if errors:
            problems.append(f"{when}: STATS after the checks: internal_errors = {errors}")
    if c.tracebacks():
        problems.append(f"{when}: a node's log holds a traceback:\n{c.tracebacks()[-4000:]}")


def test_poison_is_set_aside_by_each_new_leader_and_never_stops_one(make_cluster):
    c = make_cluster(settings=settings(), cluster_settings="replicas_ack = 1")
    c.ports = dict(zip(c.names, free_ports(len(c.names))))
    c.start()
    leader, epoch = c.leader()
    with zq.connect(c.endpoints, connect_timeout=30) as client:
        wait_until(lambda: len(client.stats(timeout=10)["server"]["replication"]["cluster"]["isr"]) == 3, timeout=30,
                   interval=0.1, what="both standbys in the in-sync set")
    problems: list[str] = []
    first = publish_round(c, leader, 0, problems)
    leader, epoch = fail_over(c, leader, epoch, problems)
    check_leader(c, leader, epoch, first, first, f"after the first failover ({leader}, epoch {epoch})", problems)
    second = publish_round(c, leader, 1, problems)
    leader, epoch = fail_over(c, leader, epoch, problems)
    check_leader(c, leader, epoch, first + second, second, f"after the second failover ({leader}, epoch {epoch})",
                 problems)
    assert not problems, f"seed {SEED}: {len(problems)} problems:\n" + "\n".join(problems[:40]) + f"\n{c.tails(30)}"
