"""Hostile message bodies against a real `zq serve` (issue #31 §1; zq.testing.bodyfuzz).

One dispatcher with a queue of every kind that evaluates content (filter, priority,
arithmetic priority, sort key on a body path and on a header, last-value key, barrier,
group header with priority, tenant header with aging priority, and a plain one), all
fed by the topic ``fz.all`` and each by its own name, all with dead letters. For each
seeded batch: every case is published (one PUBLISH each, on a raw DEALER, so each gets
its own verdict) to ``fz.all`` and to every queue (those over 64 KiB to ``fz.all`` only,
which feeds every queue), then a control to each queue; then SUB, CLAIM, REPLAY, PEEK,
QUERY, ack-filter, purge, move and redrive run with filters and values on the body
paths the cases poison; then the dispatcher is SIGKILLed and started again on the same
journal. Checked after each batch, live and after the restart:

* the dispatcher is alive and answers STATS; STATS has ``poisoned`` per queue and no
  ``internal_errors``; its stderr holds no traceback;
* every PUBLISH got a CONFIRM or an ERROR whose code is not ``internal``; a case over a
  documented limit (or with a reserved or non-UTF-8 header) is refused; nothing refused
  is in the journal, and every confirmed message is (REPLAY);
* every read and operator action with a valid filter is answered (no error at all:
  a message that cannot be evaluated fails alone, never the request);
* a control message published after the hostile ones is delivered to a filtered SUB
  (every queue but the barrier's, where an earlier barrier may rightly hold it);
* a well-formed message is never set aside as poison, nor kept out by the filter;
* every confirmed message of every queue is waiting in it, settled, set aside as poison
  (one dead letter with ``zq.reason = poison`` and ``zq.error``; ``explain`` says so), or
  kept out by the queue's filter (``zq.testing.bodyfuzz.check_fates``).

Seeded: ZQ_BODY_FUZZ_SEED (or ``--zq-seed``) replays one seed (default 31);
ZQ_BODY_FUZZ_BATCHES runs more batches (default 3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from zq.client import Client
from zq.core.errors import ZqError
from zq.testing.bodyfuzz import CASE_HEADER, BodyFuzz, Case, RawPeer, check_fates, replay_all

from tests.adapters.support import env

BATCHES = int(os.environ.get("ZQ_BODY_FUZZ_BATCHES", "3"))
MAX_MESSAGE = 2 * 1024 * 1024  # server.max_message_size here: the bodies at the limit are this big
BIG = 64 * 1024  # cases this big go to fz.all only (it feeds every queue): the journal stays small

QUEUES: dict[str, dict[str, Any]] = {
    "q.plain": {},
    "q.filter": {"filter": "/a/b >= 0"},
    "q.prio": {"priority": "/p"},
    "q.arith": {"priority": "/p * /a/b + 1"},
    "q.sort": {"sort_key": "/k"},
    "q.sorth": {"sort_key": "rank"},
    "q.lvq": {"lvq_key": "/k"},
    "q.barrier": {"barrier": "/a/b = 6"},
    "q.group": {"group_header": "g", "priority": "/a/b"},
    "q.tenant": {"tenant_header": "tenant", "priority": "priority", "priority_aging": 5},
}
DEAD = {q: f"{q}.dead" for q in QUEUES}

F_SUB = "/a/b = 1"
F_CLAIM = "/a/b = 2 AND /p >= 0"
F_ACK = "/a/b = 3"
F_PURGE = "/a/b = 4 OR /k = 'purge-me'"
F_MOVE = "/a/b = 5"
F_PEEK = "/p > 0 OR /k LIKE 'k%'"
F_REPLAY = "/a/b >= 0 AND /k ~ '^k[0-9]'"
F_REDRIVE = "/a/b = 1 AND /p < 0"  # a slice of the dead letters: back to fz.all, judged again
QUERY_BY = ["/k", "/a/b"]
QUERY_AGG = ["count", "count(/a)", "sum(/p)", "avg(/a/b)", "min(/k)", "max(/p)", "sum(/p * /a/b)"]
QUERY_FILTER = "/p IS NOT NULL OR /a IS NULL"


def toml_str(s: str) -> str:
    return "'" + s + "'"  # literal strings: no escapes (none of ours holds a quote)


def config() -> str:
    lines = [f'[server]\nmax_message_size = "{MAX_MESSAGE // 1024}KiB"\n']
    for name, kw in QUEUES.items():
        lines.append("[[queue]]")
        lines.append(f"name = {toml_str(name)}")
        lines.append(f"topics = {toml_str('^(fz[.]all|' + name.replace('.', '[.]') + ')$')}")
        lines.append(f"dead_letter = {toml_str(DEAD[name])}")
        for key, value in kw.items():
            lines.append(f"{key} = {value if isinstance(value, int) else toml_str(value)}")
        lines.append("")
    return "\n".join(lines)


class Serve:
    """`zq serve` on an ipc endpoint in ``directory``; its stderr goes to a file (a pipe
    nobody reads would fill and stall it). Stopped and killed by its PID only."""

    def __init__(self, directory: Path, config_text: str) -> None:
        self.dir = directory
        self.config = directory / "zq.toml"
        self.config.write_text(config_text)
        self.endpoint = f"ipc://{directory}/zq.sock"
        self.log = directory / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> "Serve":
        self.starts += 1
        with open(self.log, "ab") as f:
            f.write(f"=== start {self.starts}\n".encode())
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "zq.cli", "serve", "--data", str(self.dir / "journal"), "--bind",
                 self.endpoint, "--config", str(self.config)],
                env=env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"zq serve exited with {self.proc.returncode} at start {self.starts} "
                                     f"(recovery of the journal):\n{self.tail()}")
            try:
                RawPeer(self.endpoint, timeout=1.0).close()
                return self
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"zq serve (start {self.starts}) did not answer HELLO within {timeout}s:\n"
                                         f"{self.tail()}") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.text().splitlines()[-lines:])


@pytest.fixture
def serve(tmp_path):
    s = Serve(tmp_path, config())
    yield s
    s.stop()


def seed_of(request) -> int:  # type: ignore[no-untyped-def]
    if os.environ.get("ZQ_BODY_FUZZ_SEED"):
        return int(os.environ["ZQ_BODY_FUZZ_SEED"])
    one = request.config.getoption("--zq-seed", default=None)
    return one if one is not None else 31


def describe(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if type(exc) is ZqError or "internal error" in str(exc):
        code = "internal"
    return f"{type(exc).__name__} (code {code!r}): {str(exc)[:300]}"


class Batch:
    """One batch's requests against the dispatcher, with every problem written down."""

    def __init__(self, serve: Serve, number: int) -> None:
        self.serve, self.number = serve, number
        self.problems: list[str] = []
        self.took: list[tuple[float, str]] = []

    def fail_if_dead(self, after: str) -> None:
        if not self.serve.alive():
            code = self.serve.proc.returncode if self.serve.proc is not None else None
            raise AssertionError(f"batch {self.number}: zq serve died (exit {code}) during {after}"
                                 f"\n{len(self.problems)} problems before (the first 20):\n" + "\n".join(self.problems[:20])
                                 + f"\nits stderr:\n{self.serve.tail()}")

    def op(self, what: str, fn: Callable[[], Any]) -> Any:
        """A request with valid arguments: any error is a problem (a message that cannot
        be evaluated fails alone, never the request)."""
        t0 = time.monotonic()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 -- reported, with the server's fate (below)
            self.problems.append(f"batch {self.number}: {what}: {describe(exc)}")
        finally:
            self.took.append((time.monotonic() - t0, what))
        self.fail_if_dead(what)
        return None

    def stats(self, c: Client, when: str) -> dict | None:
        st = self.op(f"STATS {when}", lambda: c.stats(timeout=10))
        if st is None:
            return None
        if st["server"].get("internal_errors"):
            self.problems.append(f"batch {self.number}: STATS {when}: internal_errors = "
                                 f"{st['server']['internal_errors']} (the safety net caught a bug)")
        for q in QUEUES:
            if "poisoned" not in st["queues"].get(q, {}):
                self.problems.append(f"batch {self.number}: STATS {when}: queue {q} has no 'poisoned' field")
        return st


def control(tag: str, b: int = 1) -> Case:
    doc = json.dumps({"a": {"b": b}, "k": tag, "p": 1}).encode()
    return Case(f"control:json:{tag}", doc, {"g": tag, "tenant": "t0", "priority": "1", "rank": "1"}, normal=True)


def publish_batch(peer: RawPeer, cases: list[Case], number: int) -> list:
    items = []
    for i, case in enumerate(cases):
        topics = ["fz.all"] if len(case.payload) >= BIG else ["fz.all", *QUEUES]
        items += [(case, topic, f"b{number}.c{i}.{topic}") for topic in topics]
    return peer.publish(items, timeout=120)


def judge_verdicts(batch: Batch, verdicts: list) -> None:
    for v in verdicts:
        where = f"batch {batch.number}: PUBLISH {v.tag} ({v.case.label}, {len(v.case.payload)} bytes) to {v.topic}"
        if not v.answered:
            batch.problems.append(f"{where}: no answer")
        elif v.code == "internal":
            batch.problems.append(f"{where}: answered internal: {v.message[:200]}")
        elif v.code is not None and v.case.normal:
            batch.problems.append(f"{where}: a well-formed control was refused: {v.code} {v.message[:200]}")
        elif v.code is None and v.case.must_refuse:
            batch.problems.append(f"{where}: confirmed (bookmark {v.bookmark}) but it is over a documented limit "
                                  "or carries a reserved / non-UTF-8 header")


def check_journal(batch: Batch, c: Client, verdicts: list, mark: int, when: str) -> None:
    """Refused: not journaled; confirmed: journaled under its bookmark (REPLAY of the
    topics, from before the batch; copies made by moves and redrives carry the tag too)."""
    target = "^(fz[.]all|" + "|".join(q.replace(".", "[.]") for q in QUEUES) + ")$"
    got = batch.op(f"REPLAY {target} from {mark} ({when})", lambda: replay_all(c, target, start=mark, timeout=90))
    if got is None:
        return
    journaled: dict[str, set[int]] = {}
    for m in got:
        journaled.setdefault(m.headers.get(CASE_HEADER, ""), set()).add(m.bookmark)
    for v in verdicts:
        if v.code is not None and v.tag in journaled:
            batch.problems.append(f"batch {batch.number} ({when}): PUBLISH {v.tag} ({v.case.label}) was refused "
                                  f"({v.code}: {v.message[:120]}) but is in the journal at {sorted(journaled[v.tag])}")
        if v.bookmark is not None and v.bookmark not in journaled.get(v.tag, set()):
            batch.problems.append(f"batch {batch.number} ({when}): PUBLISH {v.tag} ({v.case.label}) was confirmed "
                                  f"as {v.bookmark} but the journal does not hold it")


def drain_sub(batch: Batch, c: Client, q: str, sentinel: int | None) -> None:
    """A filtered SUB takes and acks what matches; when ``sentinel`` is given it must
    come (a control published after the hostile ones)."""
    seen = sentinel is None
    got = 0
    with c.subscribe(q, max_backlog=64, filter=F_SUB, timeout=15) as sub:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = sub.get(timeout=0.3 if seen else 1.0)
            if msg is None:
                if seen:
                    break
                batch.fail_if_dead(f"SUB {q}")
                continue
            got += 1
            seen = seen or msg.bookmark == sentinel
            if msg.deliveries:  # a barrier comes with 0: nothing to settle
                msg.ack()
    if not seen:
        batch.problems.append(f"batch {batch.number}: SUB {q} filter {F_SUB!r}: the control {sentinel} published "
                              f"after the hostile bodies was not delivered within 15 s ({got} others were)")


def run_operations(batch: Batch, c: Client, sentinels: dict[str, int]) -> None:
    n = batch.number
    for q in QUEUES:
        batch.op(f"SUB {q} {F_SUB!r}", lambda q=q: drain_sub(batch, c, q, sentinels.get(q)))
        msgs = batch.op(f"CLAIM {q} {F_CLAIM!r}", lambda q=q: c.claim(q, limit=500, wait=0, filter=F_CLAIM))
        for m in msgs or []:
            m.ack()
        batch.op(f"PEEK {q} {F_PEEK!r}", lambda q=q: c.peek(q, limit=10_000, filter=F_PEEK, timeout=15))
        batch.op(f"PEEK {q}", lambda q=q: c.peek(q, limit=10_000, timeout=15))
        batch.op(f"QUERY {q}", lambda q=q: c.query(q, group_by=QUERY_BY, aggregates=QUERY_AGG, filter=QUERY_FILTER,
                                                   timeout=15))
        batch.op(f"ack-filter {q} {F_ACK!r}", lambda q=q: c.admin("ack-filter", 60, queue=q, filter=F_ACK))
        batch.op(f"purge {q} {F_PURGE!r}", lambda q=q: c.admin("purge", 60, queue=q, filter=F_PURGE))
        to = "q.prio" if q != "q.prio" else "q.sort"  # the copies are judged by an ordered queue
        batch.op(f"move {q} -> {to} {F_MOVE!r}", lambda q=q, to=to: c.admin("move", 60, queue=q, to=to, filter=F_MOVE))
    for target in ["fz.all", *QUEUES]:
        batch.op(f"REPLAY {target} {F_REPLAY!r}", lambda t=target: replay_filtered(c, t, F_REPLAY))
    st = batch.stats(c, f"batch {n}, after the operations")
    if st is not None:
        s = st["server"]
        print(f"batch {n}: watchdog: loop_max_ms {s.get('loop_max_ms')}, slowest_command {s.get('slowest_command')}, "
              f"slow_commands {s.get('slow_commands')}")
    known = set((st or {}).get("queues", {}))
    for q, dlq in DEAD.items():
        if dlq not in known:
            continue  # nothing was dead-lettered from q yet: its dead-letter queue does not exist
        batch.op(f"PEEK {dlq} {F_PEEK!r}", lambda d=dlq: c.peek(d, limit=10_000, filter=F_PEEK, timeout=15))
        batch.op(f"QUERY {dlq}", lambda d=dlq: c.query(d, group_by=["zq.reason", "/a/b"], aggregates=QUERY_AGG,
                                                       filter=QUERY_FILTER, timeout=15))
        batch.op(f"redrive {dlq} {F_REDRIVE!r}", lambda d=dlq: c.admin("redrive", 60, queue=d, filter=F_REDRIVE))
    batch.fail_if_dead("the operations")


def replay_filtered(c: Client, target: str, flt: str, timeout: float = 30.0) -> int:
    n = 0
    deadline = time.monotonic() + timeout
    with c.replay(target, start=0, filter=flt) as r:
        while time.monotonic() < deadline:
            try:
                msg = r.get(1.0)
            except StopIteration:
                return n
            n += msg is not None
    raise TimeoutError(f"the replay did not end within {timeout}s ({n} messages)")


def test_hostile_bodies_fail_alone_live_after_a_crash_and_at_recovery(serve, request):
    seed = seed_of(request)
    print(f"body fuzz seed {seed}, {BATCHES} batches (rerun: ZQ_BODY_FUZZ_SEED={seed})")
    fuzz = BodyFuzz(seed, max_message_bytes=MAX_MESSAGE)
    serve.start()
    confirmed: dict[str, dict[int, str]] = {q: {} for q in QUEUES}
    settings = {q: {"filter": "filter" in kw, "dead_letter": DEAD[q]} for q, kw in QUEUES.items()}
    all_problems: list[str] = []
    well_formed: set[int] = set()  # bookmarks of the controls: never poison, never kept out by q.filter
    for number in range(BATCHES):
        batch = Batch(serve, number)
        cases = fuzz.batch(number)
        with Client(serve.endpoint, connect_timeout=15) as c:
            mark = batch.op("BOUNDS", lambda: c.bounds()["next_seq"]) or 0
            peer = RawPeer(serve.endpoint, name=f"bodyfuzz-{number}")
            try:
                verdicts = publish_batch(peer, cases, number)
                batch.fail_if_dead("the publishes")
                sentinel = control(f"sentinel-{number}")
                sent = peer.publish([(sentinel, q, f"b{number}.sentinel.{q}") for q in QUEUES], timeout=30)
                verdicts += sent
                if peer.undecodable:
                    batch.problems.append(f"batch {number}: server frames that do not decode: {peer.undecodable[:3]}")
            finally:
                peer.close()
            judge_verdicts(batch, verdicts)
            well_formed.update(v.bookmark for v in verdicts if v.bookmark is not None and v.case.normal)
            for v in verdicts:
                if v.bookmark is not None:
                    for q in ([v.topic] if v.topic in QUEUES else QUEUES):
                        confirmed[q][v.bookmark] = f"{v.tag} {v.case.label}"
            sentinels = {v.topic: v.bookmark for v in sent if v.bookmark is not None and v.topic != "q.barrier"}
            refused = sum(v.code is not None for v in verdicts)
            print(f"batch {number}: {len(cases)} cases, {len(verdicts)} publishes, {refused} refused, "
                  f"codes {sorted({v.code for v in verdicts if v.code})}")
            run_operations(batch, c, sentinels)
            t0 = time.monotonic()
            check_journal(batch, c, verdicts, mark, "live")
            t1 = time.monotonic()
            fates = check_fates(c, settings, confirmed, f"batch {number}, live", well_formed=well_formed)
            print(f"batch {number}: journal check {t1 - t0:.1f} s, fates {time.monotonic() - t1:.1f} s; slowest requests: "
                  + ", ".join(f"{what} {s:.1f} s" for s, what in sorted(batch.took, reverse=True)[:6]))
            batch.problems += fates.problems
            print(f"batch {number} live: {fates.line()}")
            batch.stats(c, f"batch {number}, before the kill")
        serve.kill()
        serve.start()
        with Client(serve.endpoint, connect_timeout=15) as c:
            batch.stats(c, f"batch {number}, after the restart")
            check_journal(batch, c, verdicts, mark, "after the restart")
            fates = check_fates(c, settings, confirmed, f"batch {number}, after restart {serve.starts - 1}",
                                well_formed=well_formed)
            batch.problems += fates.problems
            print(f"batch {number} after the restart: {fates.line()}")
            batch.stats(c, f"batch {number}, after the checks")
        batch.fail_if_dead("the checks after the restart")
        if "Traceback" in serve.text():
            batch.problems.append(f"batch {number}: zq serve's stderr holds a traceback")
        all_problems += batch.problems
    assert not all_problems, (f"seed {seed}: {len(all_problems)} problems; the first 40:\n" + "\n".join(all_problems[:40])
                              + f"\n--- zq serve's stderr (tail):\n{serve.tail(40)}")
