"""An asyncio publisher and consumer (``zq.aio``): no thread of yours blocks.

    python examples/asyncio_pubsub.py [--endpoint tcp://127.0.0.1:7780] [--messages 500]

Needs a running dispatcher. The publisher awaits each batch's confirmation (durable in
the journal); the consumer iterates a subscription with ``async for`` and acks. At the
end it deletes its queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import zq
import zq.aio

QUEUE = "events.example"


async def produce(endpoint: str, n: int) -> None:
    async with await zq.aio.connect(endpoint) as c:
        for start in range(0, n, 100):
            await c.publish_many(QUEUE, [f"event {i}" for i in range(start, min(n, start + 100))])


async def consume(endpoint: str, n: int) -> list[str]:
    seen: list[str] = []
    async with await zq.aio.connect(endpoint) as c:
        async with await c.subscribe(QUEUE, max_backlog=64) as sub:
            async for msg in sub:
                seen.append(msg.data.decode())
                msg.ack()
                if len(seen) == n:
                    break
    return seen


async def main_async(endpoint: str, n: int) -> int:
    consumer = asyncio.create_task(consume(endpoint, n))
    await produce(endpoint, n)
    seen = await asyncio.wait_for(consumer, timeout=60)
    in_order = seen == [f"event {i}" for i in range(n)]
    print(f"consumed {len(seen)} of {n}, in publish order: {in_order}")
    return 0 if in_order else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", default=os.environ.get("ZQ_ENDPOINT", zq.wire.DEFAULT_ENDPOINT))
    parser.add_argument("--messages", type=int, default=500)
    args = parser.parse_args()
    code = asyncio.run(main_async(args.endpoint, args.messages))
    with zq.connect(args.endpoint) as c:
        c.delete_queue(QUEUE)  # leave the dispatcher as we found it
    return code


if __name__ == "__main__":
    sys.exit(main())
