"""Keep freed memory in the process heap instead of handing it back to the kernel (glibc only).

glibc serves any block above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps
it on ``free``. The widest activations of a CPU batch are larger than that (tf_efficientnet_lite0
at batch 8: 38.5 MB after its first expansion), so every batch page-faulted them in again, zeroed
by the kernel. ``keep_freed_memory`` turns mmap allocation off and raises the trim threshold through
``mallopt``, so blocks are reused from the heap. It also keeps every thread on the one main heap
(``M_ARENA_MAX`` 1): a thread's own arena is made of 64 MiB mapped heaps that glibc unmaps when they
empty, whatever the trim threshold, so batches on forward threads would page-fault their activations
in again (``benchmarks/heap_faults.py`` counts the faults). Resident memory then stays at the run's
peak, which an eval process reaches on its first batches anyway. DataLoader workers forked afterwards
inherit the setting. Elsewhere than glibc it does nothing. A process-wide setting that cannot be
undone: ``bench eval`` makes it, the library (``genshift.evaluate``) never does.
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
