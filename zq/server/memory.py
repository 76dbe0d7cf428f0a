"""The dispatcher process gives big blocks back to the OS as soon as they are freed.

A publish of 16 MiB messages is copied a few times on its way to the journal (the frame,
the decoded payloads, the record, LMDB's dirty pages), each copy a block of megabytes
freed a moment later. glibc serves blocks over its mmap threshold with their own
mapping and unmaps them on free, but it raises that threshold to the size of each such
block freed (up to 32 MiB), after which those blocks come from the heap and stay in
the process: three 32 MiB publish frames left `zq serve` 276 MiB bigger, 68 MiB with a
fixed 1 MiB threshold (measured 2026-11-26). Only ``zq serve`` sets it: an embedding
process keeps its own allocator settings.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("zq.server")

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 1024 * 1024


def return_big_blocks() -> bool:
    """Fix glibc's mmap threshold at 1 MiB (setting it turns its raising off). Returns
    whether it was set (not on a libc without ``mallopt``, e.g. musl: nothing to do)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
