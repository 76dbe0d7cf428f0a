"""A thread that runs the journal's periodic sync, so that the loop does not wait on it.

In ``batch`` durability nothing waits on a sync: a confirmation promises the commit,
not the disk. Yet the once-a-second ``fdatasync`` (1.1-1.6 ms on this machine kind,
far longer when the disk stalls) and, every few seconds, the directory's mark
(another 0.6-1.2 ms: a file written, synced, renamed) ran on the dispatcher's loop
thread, and every frame arriving meanwhile waited for them: at 2,000 msg/s a few
messages a second, which is a p99.9 (issue #34). py-lmdb releases the GIL in
``env.sync``, and an ``fdatasync`` makes durable whatever was committed before it
began, so the loop can go on committing while it runs here.

One job at a time: a job asked while another runs waits for it, and a newer job
replaces one not yet started (each covers everything the older one would have).
``take`` hands the loop the last finished job's result or error, in the loop's own
thread, where the journal's state is changed. The thread ends when it has had nothing
to do for ``IDLE_S`` (a journal never closed leaves no thread behind for long) and
starts again with the next job.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

IDLE_S = 10.0  # with no job for this long the thread ends (the next job starts another)


class Syncer:
    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._next: Callable[[], Any] | None = None  # asked, not started
        self._running = False
        self._results: list[Any] = []  # finished, not yet taken
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None  # while one runs (or waits for a job)
        self._started = 0.0  # when the running job began (monotonic), 0 when none runs
        self.last_ms = 0.0  # how long the last job took: a slow disk shows here (STATS)

    def ask(self, job: Callable[[], Any]) -> None:
        """Run ``job`` on the thread, after the one running (it replaces one waiting)."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the journal's syncer has stopped")
            if self._thread is None:  # started before anything changes: if it cannot start, nothing is asked
                thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                thread.start()  # (it waits for the lock held here)
                self._thread = thread
            self._next = job
            self._changed.notify_all()

    def take(self) -> tuple[list[Any], BaseException | None]:
        """The results of the jobs finished since the last call, and the error of the
        last one that failed (a failed job is not run again: its caller asks anew)."""
        with self._lock:
            results, self._results = self._results, []
            error, self._error = self._error, None
        return results, error

    def busy(self) -> bool:
        """A job runs or waits."""
        with self._lock:
            return self._next is not None or self._running

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job runs or waits (False if ``timeout`` passed first)."""
        with self._lock:
            return self._changed.wait_for(lambda: self._next is None and not self._running, timeout)

    def running_ms(self) -> float:
        """How long the job now running has run (0: none): a disk that stalls shows here
        long before the sync returns."""
        started = self._started
        return (time.monotonic() - started) * 1000 if started else 0.0

    def stop(self, timeout: float | None = None) -> None:
        """Run what was asked, then end the thread (again: nothing more to do)."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread.is_alive():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._changed.wait_for(lambda: self._next is not None or self._stopping, IDLE_S) \
                        or self._next is None:
                    self._thread = None  # idle, or stopping with nothing left: the next job starts another
                    return
                job, self._next = self._next, None
                self._running = True
                self._started = time.monotonic()
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except BaseException as exc:  # handed to the loop, which decides (a full disk: publishing pauses)
                error = exc
            with self._lock:
                self._running = False
                self.last_ms = (time.monotonic() - self._started) * 1000
                self._started = 0.0
                if error is None:
                    self._results.append(result)
                else:
                    self._error = error
                self._changed.notify_all()
            job = result = error = None  # type: ignore[assignment]  # (the job's closure holds the journal)
