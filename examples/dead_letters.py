"""Dead letters and redrive: a message that keeps failing is set aside instead of
blocking or looping forever; once the cause is fixed, send it back.

    python examples/dead_letters.py [--endpoint tcp://127.0.0.1:7780]

Needs a running dispatcher. The queue is declared with ``max_deliveries = 2`` and
``dead_letter = "payments.example.dead"``: a message delivered twice without an ack goes
there, with ``zq.reason``, ``zq.queue`` and its delivery count in its headers. A
dead-letter queue is an ordinary queue: peek at it, consume it, or ``redrive`` it back
to the topic each message came from (same id and headers). At the end it deletes both
queues.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import zq

QUEUE, DEAD = "payments.example", "payments.example.dead"


def process(msg: zq.Message, fixed: bool) -> bool:
    payment = json.loads(msg.data)
    return fixed or payment["currency"] != "XYZ"  # XYZ is not supported (yet)


def drain(endpoint: str, fixed: bool) -> tuple[int, int]:
    ok = failed = 0
    with zq.Worker(endpoint, QUEUE, max_backlog=4) as w:
        while (msg := w.get(timeout=1.0)) is not None:
            if process(msg, fixed):
                msg.ack()
                ok += 1
            else:
                msg.cancel()  # back to the queue, delivery count + 1; at 2 it is dead-lettered
                failed += 1
    return ok, failed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    args = parser.parse_args()
    with zq.connect(args.endpoint) as c:
        names = {q["name"] for q in c.queues()}
        if QUEUE not in names:
            # backoff = []: a cancelled message goes again at once (by default it waits 1 s, then 5 s, ...)
            c.create_queue(QUEUE, max_cancels=2, dead_letter=DEAD, backoff=[])
        for name in (QUEUE, DEAD):
            if name in names:
                c.purge(name)  # a clean start after a run that stopped half-way
        for i, currency in enumerate(["EUR", "USD", "XYZ", "EUR"]):
            c.publish(QUEUE, json.dumps({"id": i, "amount": 10 * i, "currency": currency}))

        ok, failed = drain(args.endpoint, fixed=False)
        print(f"first pass: {ok} paid, {failed} failed deliveries")
        dead = c.peek(DEAD)
        for m in dead:
            print(f"dead letter: {m['data'].decode()} reason={m['headers'].get('zq.reason')}")

        # The fix ships (XYZ supported): send the dead letters back where they came from.
        back = c.redrive(DEAD)
        ok2, failed2 = drain(args.endpoint, fixed=True)
        print(f"redrove {back}; second pass: {ok2} paid, {failed2} failed")
        for name in (QUEUE, DEAD):
            c.delete_queue(name)  # leave the dispatcher as we found it
    good = ok == 3 and len(dead) == 1 and back == 1 and ok2 == 1 and failed2 == 0
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
