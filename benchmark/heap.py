"""Keep freed memory in the process heap instead of handing it back to the kernel (glibc only).

glibc serves any block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps
it on ``free``. The widest activations of a CPU batch are larger than that (tf_efficientnet_lite0
at batch 8: 38.5 MB after its first expansion), so every batch page-faulted them in again, zeroed
by the kernel: about a third of a CPU eval's CPU time was kernel time (docs/performance.md,
"Eval"). ``keep_freed_memory`` turns mmap allocation off and raises the trim threshold through
``mallopt``, so blocks are reused from the heap. It also keeps every thread on the one main heap
(``M_ARENA_MAX`` 1): a thread's own arena is made of 64 MiB mapped heaps that glibc unmaps when they
empty, whatever the trim threshold, so batches run on forward threads and sweep lanes page-faulted
their activations in again (a Lite0/1/2 sweep: 1.9 million minor faults and 5.4 s of kernel time in
the main process, 0.4 million and 1.6 s on the main heap). Resident memory then stays at the run's peak,
which an eval process reaches on its first batches anyway. DataLoader workers forked afterwards
inherit the setting. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # <malloc.h>


def keep_freed_memory() -> bool:
    """Serve large blocks from the heap, never trim it, and serve every thread from it (call before the
    threads allocate); True when glibc took all three settings."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30)) and bool(mallopt(M_ARENA_MAX, 1))
    log.debug("glibc mallopt: mmap off, trim threshold 1 GiB, one arena: %s", ok)
    return ok
