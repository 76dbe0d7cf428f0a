"""The wire fuzzer against a real `zq serve` (zq.testing.wirefuzz): a few thousand frames,
a fresh seed each run (printed; rerun one with ZQ_FUZZ_SEED). The long run and its
figures are in docs/reliability.md."""

from __future__ import annotations

import os
import random

from zq.testing.wirefuzz import WireFuzz

from tests.adapters.support import ServerProcess

FRAMES = int(os.environ.get("ZQ_FUZZ_FRAMES", "4000"))


def test_no_frame_kills_or_stalls_the_dispatcher(tmp_path):
    seed = int(os.environ.get("ZQ_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"wire fuzz seed {seed} (rerun: ZQ_FUZZ_SEED={seed})")
    server = ServerProcess(tmp_path).start()
    fuzz = WireFuzz(server.endpoint, seed, batch=250, alive=lambda: server.proc.poll() is None)
    try:
        report = fuzz.run(FRAMES, time_limit=240)
    finally:
        fuzz.close()
        err = server.terminate()
    print(report.line())
    assert report.failures == [], f"seed {seed}: {report.failures[:5]}\n{err[-3000:]}"
    assert report.frames == FRAMES, f"seed {seed}: only {report.frames} frames in the time limit"
    assert report.server["internal_errors"] == 0, f"seed {seed}: the safety net caught a bug:\n{err[-5000:]}"
    assert report.server["slowest_command"]["ms"] < 1000, f"seed {seed}: {report.server['slowest_command']}"
    assert "Traceback" not in err, err[-5000:]
