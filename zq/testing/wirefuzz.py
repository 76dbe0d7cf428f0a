"""A seeded fuzzer of ZQP/1, run against a real ``zq serve``.

Theory of operation
-------------------
Several raw DEALER peers send frames a hostile or broken client could send: valid
commands of every type with extreme field values (ints at the edges of 64 bits, empty
and 5,000-character names, backtracking patterns, huge IN lists, durations of a
million years), the same frames with bytes flipped, inserted or cut, strings that are
not UTF-8, several body frames at once, commands before HELLO and HELLO twice, and
settles naming subscription ids other peers use. The peers read whatever comes back
and check that every frame the server sends decodes as a server frame.

After every batch a separate control peer asks for STATS (bounded wait), and a real
``zq.Publisher`` and ``zq.Worker`` move one message end to end on a queue the fuzz
peers never name. The run fails at the first batch after which any of that does not
happen. The server's own watchdog (``stats.server``: the longest loop iteration, the
slowest command, the errors its safety net caught) is read at the end: a non-zero
``internal_errors`` is a bug even though the dispatcher survived it.

``python -m zq.testing.wirefuzz --frames 1000000`` is the long run
(docs/reliability.md); the suite runs a few thousand frames with a fresh seed each time.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import zmq

from zq import wire

LIVE_QUEUE = "livecheck"  # the queue the real publisher and worker use; never named by the fuzz peers

INTS = [0, 1, -1, 2, 7, 100, 1000, 65_535, 65_536, 2**31 - 1, 2**31, 2**32, 2**40, 10**12, 2**53,
        2**63 - 1, -(2**63), 2**64 - 1, -(2**31)]
NAMES = ["jobs", "fz.a", "fz.b", "fz.a.dead", "", "x" * 600, "y" * 5000, "é" * 300, "zq.", "jobs.dead",
         "fz.c", "\x00", "fz a", "^fz\\..*$", "^(a+)+$", "^.*a.*a.*a.*x$", "^(?=x)y$", "^(a)\\1$", "[", "^$"]
TOPICS = ["jobs", "fz.a", "fz.b", "fz.c", "fz.a.dead", "", "t" * 481, "t" * 5000, "a" * 29 + "!", "é" * 241]
SUB_IDS = ["s1", "s2", "c1", "r1", "", "s" * 200, "s" * 5000]
FILTERS = [
    None, "", "x = 1", "x = 1e999", "x > -1e999", "x = 1e308 * 10", "x LIKE '" + "%" * 200 + "b'",
    "x LIKE '%a%a%a%a%a%a%a%a%a%a%b'", "x ~ '(a+)+$'", "x ~ '.*a.*x'", "x ~ '(a)\\1'",
    "x IN (" + ",".join(str(i) for i in range(2000)) + ")", "x IN (" + ",".join(str(i) for i in range(1000)) + ")",
    "(" * 100 + "x = 1" + ")" * 100, "NOT " * 200 + "x", "/a/b/c = 'z'", "@topic = 'fz.a'", "x = 99999999999999999999999",
    "x * x * x * x * x * x > 1", "x = " + "9" * 4000, "x +", "'unterminated", "x = 'a' AND", "priority > 3",
    "\udcff" if False else "x = '\u2603'", "a" * 5000, " OR ".join(f"x = '{i}'" for i in range(250)),
    "x = " + " + ".join(["1"] * 300), "x = " + "-" * 300 + "1",
]
DURATIONS = ["1s", "30s", "0s", "-1s", "99999999999999999999d", "1" * 400 + "d", "1e9h", "5m", "", "abc", 10**19, -1, 0]
SIZES = ["1KiB", "0", "9" * 30 + "TiB", "16MiB", 2**64 - 1, -5, "x"]
EXPRS = [None, "priority", "/n", "x = 1e999", "1e999", "x ~ '(a+)+$'", "(" * 70 + "x" + ")" * 70, "a" * 5000,
         " + ".join(["x"] * 300)]
ADMIN_OPS = ["replace", "ack-filter", "purge", "move", "redrive", "groups", "queue-create", "queue-delete",
             "nope", "", "x" * 1000]


@dataclass
class Report:
    seed: int
    frames: int = 0
    batches: int = 0
    replies: int = 0
    stats_rtt_max_ms: float = 0.0
    live_rtt_max_ms: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        s = self.server
        return (f"seed={self.seed} frames={self.frames} batches={self.batches} replies={self.replies} "
                f"stats_rtt_max_ms={self.stats_rtt_max_ms:.1f} live_rtt_max_ms={self.live_rtt_max_ms:.1f} "
                f"loop_max_ms={s.get('loop_max_ms')} phases={s.get('loop_max_phases')} slowest_command={s.get('slowest_command')} "
                f"slow_commands={s.get('slow_commands')} internal_errors={s.get('internal_errors')} "
                f"failures={len(self.failures)}")


class FrameMaker:
    """Frames from a seed: the same seed makes the same frames."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.req = 0

    # ------------------------------------------------------------ values

    def pick(self, options: list) -> Any:
        return options[self.rng.randrange(len(options))]

    def int_(self) -> int:
        r = self.rng.random()
        if r < 0.6:
            return self.pick(INTS)
        if r < 0.8:
            return self.rng.randint(-(2**63), 2**64 - 1)
        return self.rng.randint(0, 50)

    def str_(self, pool: list[str]) -> str:
        return self.pick(pool) if self.rng.random() < 0.9 else "".join(
            chr(self.rng.randint(32, 0x2FFF)) for _ in range(self.rng.randint(0, 40)))

    def anything(self) -> Any:
        """A value of a random type (a wrong type for most fields)."""
        return self.pick([None, True, 1.5, float("nan"), [], {}, {"a": 1}, b"\xff\xfe", "s", self.int_(), [1, "x"]])

    def maybe_wrong(self, value: Any) -> Any:
        return self.anything() if self.rng.random() < 0.06 else value

    def headers(self) -> Any:
        r = self.rng.random()
        if r < 0.5:
            return {}
        if r < 0.7:
            return {"group": self.pick(["g1", "g2", "g3", "", "g" * 5000]), "priority": self.pick(["1", "99999999999999999999", "-3", "x"]),
                    "tenant": self.pick(["a", "b", "", "t" * 4000])}
        if r < 0.8:
            return {f"h{i}": "v" for i in range(self.pick([10, 64, 65, 200]))}
        if r < 0.9:
            return {"ts": 30, "zq.reason": "x"}  # wrong value type; a reserved name
        return {"x": "a" * self.pick([10, 4096, 4097, 100_000])}

    # ------------------------------------------------------------ commands

    def next_req(self) -> int:
        self.req += 1
        return self.maybe_wrong(self.req if self.rng.random() < 0.9 else self.int_())

    def command(self) -> list:
        """One command as a msgpack-able list ``[tag, fields...]`` (fields may be wrong)."""
        m = self.rng.randrange(19)
        f, n, s = self.maybe_wrong, self.int_, self.str_
        req = self.next_req()
        if m == 0:
            return ["hello", f(self.pick([1, 1, 1, 2, 0, 2**64 - 1])), f(s(NAMES))]
        if m == 1:
            count = self.pick([1, 1, 3, 0, 50])
            msgs = [[self.pick([b"x", b"", b'{"a": {"b": {"c": "z"}}, "n": 3}', b"\x81\xa1n\x03", b"p" * 1000]),
                     f(self.headers()), self.pick([None, "id-1", "id-2", "", "i" * 5000])] for _ in range(count)]
            return ["pub", req, f(s(TOPICS)), f(msgs)]
        if m == 2:
            cmd = ["sub", req, f(s(SUB_IDS)), f(s(NAMES)), f(self.pick([1, 16, 0, -1, n()])), f(self.pick(FILTERS))]
            if self.rng.random() < 0.5:  # reclaimable: its unstarted deliveries may be revoked
                cmd.append(f(self.pick([True, False])))
            return cmd
        if m == 3:
            return ["unsub", req, f(s(SUB_IDS))]
        if m in (4, 5, 6):
            tag = ("ack", "cancel", "expire")[m - 4]
            return [tag, f(s(SUB_IDS)), f([n() if self.rng.random() < 0.3 else self.rng.randint(0, 200)
                                           for _ in range(self.pick([1, 5, 0, 300]))])]
        if m == 7:
            if self.rng.random() < 0.5:  # an answer to a revoke nobody sent, or to one that was sent
                marks = [self.rng.randint(0, 200) if self.rng.random() < 0.7 else n() for _ in range(self.pick([1, 4, 0]))]
                epochs = [self.pick([1, 2, 0, n()]) for _ in range(self.pick([len(marks), len(marks), 1]))]
                return ["release", f(s(SUB_IDS)), f(marks), f(epochs), f(marks[:1]), f(epochs[:1])]
            return ["extend", f(s(SUB_IDS)), f([self.rng.randint(0, 200), n()]), f(n())]
        if m == 8:
            return self.pick([["hb"], ["bye"], ["stats", req], ["queues", req]])
        if m == 9:
            return ["peek", req, f(s(NAMES)), f(n()), f(self.pick(FILTERS))]
        if m == 10:
            return ["claim", req, f(s(SUB_IDS)), f(s(NAMES)), f(self.pick([1, 5, 0, n()])), f(self.pick([0, 10, 2**40, n()])),
                    f(self.pick([1000, 0, n()])), f(self.pick([False, True])), f(self.pick(FILTERS))]
        if m == 11:
            return ["replay", req, f(s(SUB_IDS)), f(s(NAMES + TOPICS)), f(self.pick([0, -1, n()])),
                    f(self.pick([None, n()])), f(self.pick([None, n(), 10**12])), f(self.pick([False, True])),
                    f(self.pick(FILTERS)), f(self.pick([1, 1000, n(), 10**12]))]
        if m == 12:
            return ["range", req, f(self.pick(["messages", "events", "x"])), f(self.pick([0, n()])),
                    f(self.pick([None, n()])), f(self.pick([None] + NAMES)), f(self.pick([1, 65_536, n()]))]
        if m == 13:  # (a standby's: its position, and a wait for the journal to pass ``after``)
            return ["bounds", req, f(self.pick([None, n()])), f(self.pick([-1, 0, n()])), f(self.pick([0, 50, -1, n()])),
                    f(self.pick([-1, 0, 5, n()]))]
        if m == 14:
            return ["query", req, f(s(NAMES)), f(self.pick([[], ["group"], ["/a/b"], ["x" * 5000], ["1e999"]])),
                    f(self.pick([[], ["count()"], ["sum(/n)"], ["avg(1e999)"], ["max(x ~ '(a+)+$')"], ["nope("]])),
                    f(self.pick(FILTERS))]
        return ["admin", req, self.pick(ADMIN_OPS), f(self.admin_args())]

    def admin_args(self) -> Any:
        f, s, n = self.maybe_wrong, self.str_, self.int_
        r = self.rng.random()
        if r < 0.45:
            args: dict[str, Any] = {"name": s(NAMES)}
            for key, values in (("topics", [None] + NAMES), ("lease", DURATIONS), ("expiration", DURATIONS),
                                ("dedup_window", DURATIONS), ("max_bytes", SIZES), ("filter", FILTERS),
                                ("priority", EXPRS), ("sort_key", EXPRS), ("lvq_key", EXPRS), ("barrier", FILTERS),
                                ("max_depth", [0, 1, n()]), ("max_groups", [1, n()]), ("dead_letter", [None] + TOPICS),
                                ("publish_to", [None] + TOPICS), ("group_header", ["group", "", "g" * 5000, None]),
                                ("max_per_subscription_backlog", [1, n()]), ("target_queue_depth", [0, 10, n()]),
                                ("overflow", ["reject", "ring", "flow-control", "x"]), ("max_deliveries", [0, 3, n()]),
                                ("group_policy", ["sequenced", "exclusive", "x"]), ("semantics", ["at-most-once", "x"]),
                                ("tenant_header", ["tenant", "", "t" * 5000, None]), ("priority_aging", [0, 5, n()]),
                                ("tenant_weights", [{}, {"a": 3}, {"a": n()}, {"x" * 5000: 1}, {"a": "x"}, [1]]),
                                ("tenant_default_weight", [1, 0, n()])):
                if self.rng.random() < 0.25:
                    args[key] = f(self.pick(values))
            return args
        return {k: f(self.pick(v)) for k, v in (("queue", NAMES), ("to", TOPICS + NAMES), ("filter", FILTERS),
                                                   ("group", ["g1", "g2", None, "g" * 5000]), ("sub", SUB_IDS),
                                                   ("max_backlog", [1, n()]), ("limit", [10, n()]), ("name", NAMES))
                if self.rng.random() < 0.6}

    # ------------------------------------------------------------ frames

    def encode(self, cmd: list) -> bytes:
        try:
            return msgspec.msgpack.encode(cmd)
        except (OverflowError, TypeError, ValueError):
            return msgspec.msgpack.encode(["hb"])

    def body(self) -> list[bytes]:
        """The frames of one message from a peer (usually one body frame)."""
        r = self.rng.random()
        frame = self.encode(self.command())
        if r < 0.70:
            return [frame]
        if r < 0.88:
            return [self.mutate(frame)]
        if r < 0.93:
            return [self.not_utf8()]
        if r < 0.96:
            return [frame, self.encode(self.command())]
        return [self.pick([b"", b"\xc1", b"\x91\xa5hello", b"\xdd\xff\xff\xff\xff", b"\x92\xa2hb\xc0",
                           os.urandom(self.rng.randint(1, 64))])]

    def mutate(self, frame: bytes) -> bytes:
        b = bytearray(frame)
        for _ in range(self.rng.randint(1, 4)):
            op = self.rng.randrange(3)
            i = self.rng.randrange(len(b) + 1)
            if op == 0 and b:
                b[min(i, len(b) - 1)] ^= 1 << self.rng.randrange(8)
            elif op == 1:
                b[i:i] = bytes([self.rng.randrange(256)])
            else:
                del b[i:]
        return bytes(b)

    def not_utf8(self) -> bytes:
        """A well-formed command whose name string is not UTF-8 (once ended the server)."""
        bad = self.pick([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b"])
        tag = self.pick([b"sub", b"peek", b"hello", b"stats"])
        head = bytes([0xA0 | len(tag)]) + tag
        s = bytes([0xA0 | len(bad)]) + bad
        if tag == b"hello":
            return b"\x93" + head + b"\x01" + s
        if tag == b"sub":
            return b"\x95" + head + b"\x01" + s + s + b"\x01"
        if tag == b"peek":
            return b"\x94" + head + b"\x01" + s + b"\x05"
        return b"\x92" + head + b"\x01"


class WireFuzz:
    """Drive ``FrameMaker`` frames at ``endpoint`` in batches, checking the server after each."""

    def __init__(self, endpoint: str, seed: int, peers: int = 4, batch: int = 250,
                 alive: Callable[[], bool] | None = None, check_timeout: float = 15.0) -> None:
        self.endpoint = endpoint
        self.maker = FrameMaker(seed)
        self.report = Report(seed)
        self.batch = batch
        self.alive = alive or (lambda: True)
        self.check_timeout = check_timeout
        self.ctx = zmq.Context.instance()
        self.peers = [self.dealer() for _ in range(peers)]
        self.control = self.dealer()
        self.control_req = 0
        from zq.client.publisher import Publisher
        from zq.client.worker import Worker

        self.publisher = Publisher(endpoint, name="fuzz-live")
        self.worker = Worker(endpoint, LIVE_QUEUE, max_backlog=4, name="fuzz-live")
        self.say_hello(self.control)
        for p in self.peers[: peers // 2 + 1]:  # the others start without a session
            p.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "fuzz")))

    def dealer(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 100_000)
        s.connect(self.endpoint)
        return s

    def say_hello(self, sock: zmq.Socket) -> None:
        sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "fuzz-control")))
        self.expect(sock, wire.Welcome, "WELCOME")

    def expect(self, sock: zmq.Socket, kind: type, what: str, req: int | None = None) -> Any:
        deadline = time.monotonic() + self.check_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000)):
                raise FuzzFailure(f"no {what} within {self.check_timeout:.0f} s"
                                  + ("" if self.alive() else ": the server process has exited"))
            msg = wire.server_decoder.decode(sock.recv())
            if type(msg) is kind and (req is None or msg.req == req):
                return msg

    def drain(self) -> None:
        for sock in self.peers:
            while sock.poll(0):
                frame = sock.recv()
                self.report.replies += 1
                try:
                    wire.server_decoder.decode(frame)
                except msgspec.DecodeError as exc:
                    self.report.failures.append(f"server sent a frame clients cannot decode: {exc}: {frame[:80]!r}")

    def stats(self) -> dict:
        self.control_req += 1
        self.control.send(wire.encode(wire.Stats(self.control_req)))
        return self.expect(self.control, wire.Reply, "STATS answer", self.control_req).data

    def check(self) -> None:
        """The server answers, and a real publisher and worker still move a message."""
        t0 = time.perf_counter()
        self.stats()
        t1 = time.perf_counter()
        payload = f"live-{self.report.batches}".encode()
        self.publisher.publish(LIVE_QUEUE, payload, timeout=self.check_timeout)
        deadline = time.monotonic() + self.check_timeout
        while True:
            msg = self.worker.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg is not None:
                msg.ack()
                if msg.data == payload:
                    break
            elif time.monotonic() > deadline:
                raise FuzzFailure(f"the live worker got no message within {self.check_timeout:.0f} s")
        t2 = time.perf_counter()
        r = self.report
        r.stats_rtt_max_ms = max(r.stats_rtt_max_ms, (t1 - t0) * 1000)
        r.live_rtt_max_ms = max(r.live_rtt_max_ms, (t2 - t1) * 1000)

    def run(self, frames: int, time_limit: float = 600.0) -> Report:
        stop_at = time.monotonic() + time_limit
        maker, peers = self.maker, self.peers
        try:
            while self.report.frames < frames and time.monotonic() < stop_at:
                for _ in range(min(self.batch, frames - self.report.frames)):
                    peer = peers[maker.rng.randrange(len(peers))]
                    parts = maker.body()
                    peer.send_multipart(parts, copy=True)
                    self.report.frames += 1
                self.drain()
                self.check()
                self.report.batches += 1
            self.drain()
            self.report.server = self.stats()["server"]
        except FuzzFailure as exc:
            self.report.failures.append(f"after {self.report.frames} frames: {exc}")
        return self.report

    def close(self) -> None:
        for s in [*self.peers, self.control]:
            s.close(0)
        self.publisher.close()
        self.worker.close()


class FuzzFailure(Exception):
    pass


def serve(data_dir: str) -> tuple[subprocess.Popen, str]:
    """A real ``zq serve`` on an ipc endpoint in ``data_dir``; ready when it answers."""
    endpoint = f"ipc://{data_dir}/zq.sock"
    proc = subprocess.Popen([sys.executable, "-m", "zq.cli", "serve", "--data", f"{data_dir}/journal",
                             "--bind", endpoint], stderr=subprocess.PIPE, text=True)
    from zq.client import Client

    Client(endpoint, connect_timeout=20).close()
    return proc, endpoint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--time-limit", type=float, default=3600.0, help="seconds; the run stops itself")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    with tempfile.TemporaryDirectory(prefix="zq-fuzz-") as d:
        proc, endpoint = serve(d)
        fuzz = WireFuzz(endpoint, seed, batch=a.batch, alive=lambda: proc.poll() is None)
        try:
            started = time.monotonic()
            report = fuzz.run(a.frames, a.time_limit)
            took = time.monotonic() - started
        finally:
            fuzz.close()
            alive = proc.poll() is None
            if alive:
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    print(report.line(), f"seconds={took:.0f} server_alive={alive}")
    for line in err.splitlines():
        if "held the loop" in line:
            print("SLOW", line)
    for failure in report.failures[:20]:
        print("FAIL", failure)
    if report.server.get("internal_errors") or not alive:
        print(err[-5000:])
    return 1 if report.failures or not alive or report.server.get("internal_errors") else 0


if __name__ == "__main__":
    sys.exit(main())
