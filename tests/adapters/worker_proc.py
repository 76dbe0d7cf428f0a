"""A worker process for end-to-end tests.

Modes: ``ack`` acks every message; ``hold`` acks nothing (to be killed holding a full
backlog). Every message it takes is logged as ``<bookmark> <group> <deliveries> got``
and, once acked, ``... done``; the file is flushed per line.
"""

import signal
import sys

from zq.client import Client


def main(endpoint: str, queue: str, log_path: str, backlog: int, mode: str) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(log_path, "a", buffering=1) as log, Client(endpoint, name=f"test-{mode}") as c:
        with c.subscribe(queue, max_backlog=backlog) as sub:
            log.write("subscribed\n")
            while not stop:
                msg = sub.get(timeout=0.1)
                if msg is None:
                    continue
                log.write(f"{msg.bookmark} {msg.group or '-'} {msg.deliveries} got\n")
                if mode == "ack":
                    msg.ack()
                    log.write(f"{msg.bookmark} {msg.group or '-'} {msg.deliveries} done\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
