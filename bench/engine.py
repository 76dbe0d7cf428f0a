"""Engine-only scenarios: no sockets, no disk. What the pure core costs."""

from __future__ import annotations

import gc
import time
import tracemalloc

from zq.core import Engine, QueueSettings


def level_headers(levels: int, tenants: int = 0) -> list[dict[str, str]]:
    """Headers cycling through ``levels`` priorities, mixed (a 10-level queue's workload),
    and through ``tenants`` tenants (a fair queue's: every tenant sends every priority)."""
    prios = [{"prio": str((i * 7) % levels)} for i in range(levels)] if levels else [{}]
    if not tenants:
        return prios
    p = len(prios)
    return [{**prios[i % p], "tenant": f"t{(i // p) % tenants}"} for i in range(p * tenants)]


def kind_settings(name: str, levels: int, tenants: int, **kw: object) -> QueueSettings:
    """A FIFO, priority (``levels``) or fair (``tenants``, weights 1..4) queue."""
    if tenants:  # (only then: ``engine-vs`` runs this against cores from before fair queues)
        kw.update(tenant_header="tenant", tenant_weights={f"t{i}": 1 + i % 4 for i in range(tenants)})
    return QueueSettings(name=name, priority="prio" if levels else None, **kw)  # type: ignore[arg-type]


def memory(n: int, grouped: bool = False, groups: int = 1000, levels: int = 0, scenario: str = "engine-memory",
           tenants: int = 0) -> dict:
    """Heap growth per queued message with no consumers (payloads live in the journal).

    ``levels``: a priority queue (``priority = "prio"``) fed that many priorities;
    ``tenants``: a fair queue fed that many tenants."""
    settings = kind_settings("jobs", levels, tenants, group_header="group" if grouped else None)
    engine = Engine([settings])
    headers = [{"group": f"g{i}"} for i in range(groups)] if grouped else level_headers(levels, tenants)
    payload = b"x" * 128
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for start in range(0, n, 4096):  # publish frames as the server receives them
        engine.publish_many("jobs", [(payload, headers[i % len(headers)], None) for i in range(start, min(start + 4096, n))], 0)
        engine.drain(0)  # the adapter takes the records away to the journal
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    q = engine.queues["jobs"]
    assert q.depth == n
    return {"scenario": scenario, "queued": n, "grouped": grouped, "priority_levels": levels, "tenants": tenants,
            "heap_bytes_per_message": round(grown / n, 1)}


def throughput(n: int, workers: int = 4, backlog: int = 16, batch: int = 64, groups: int = 0, levels: int = 0,
               scenario: str = "engine-throughput", fenced: bool = False, tenants: int = 0) -> dict:
    """publish -> deliver -> ack through the engine alone, batched as the server batches.
    ``fenced``: acks name each delivery's epoch and go through ``Engine.settle``, as the
    server's do since fenced leases; else the unfenced ``Engine.ack``."""
    settings = kind_settings("jobs", levels, tenants, max_per_subscription_backlog=max(backlog, 1),
                             group_header="group" if groups else None)
    engine = Engine([settings])
    for w in range(workers):
        engine.subscribe(f"w{w}", "jobs", f"w{w}", backlog, 0)
    payload = b"x" * 128
    headers = [{"group": f"g{i}"} for i in range(groups)] if groups else level_headers(levels, tenants)
    held: dict[str, list[int]] = {f"w{w}": [] for w in range(workers)}
    epochs: dict[str, list[int]] = {f"w{w}": [] for w in range(workers)}
    published = acked = 0
    now = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while acked < n:
        now += 1
        k = min(batch, n - published)
        if k:
            engine.publish_many("jobs", [(payload, headers[(published + i) % len(headers)], None) for i in range(k)], now)
            published += k
        for sub, seqs in held.items():
            if seqs:
                if fenced:
                    engine.settle("ack", sub, seqs, epochs[sub], now)
                    epochs[sub] = []
                else:
                    engine.ack(sub, seqs, now)
                acked += len(seqs)
                held[sub] = []
        out = engine.drain(now)
        for d in out.deliveries:
            held[d.sub_id].extend(d.seqs)
            if fenced:
                epochs[d.sub_id].extend(d.deliveries)
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0  # this process's CPU: what a shared VM's stolen time does not inflate
    return {
        "scenario": scenario,
        "messages": n,
        "priority_levels": levels,
        "tenants": tenants,
        "workers": workers,
        "backlog": backlog,
        "publish_batch": batch,
        "groups": groups,
        "settles": "fenced (Engine.settle, epochs)" if fenced else "unfenced (Engine.ack)",
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(n / elapsed),
        "cpu_us_per_msg": round(cpu / n * 1e6, 3),
    }


def kinds(n_memory: int, n_throughput: int) -> list[dict]:
    """A priority queue with 10 levels, a fair queue of 100 tenants (weights 1..4) and
    both at once, next to a plain FIFO: memory per queued message (no consumers) and
    engine-only throughput (4 workers, backlog 16, batches of 64)."""
    rows = []
    for levels, tenants in ((0, 0), (10, 0), (0, 100), (10, 100)):
        rows.append(memory(n_memory, levels=levels, tenants=tenants, scenario="kinds"))
        rows.append(throughput(n_throughput, levels=levels, tenants=tenants, scenario="kinds"))
    return rows
