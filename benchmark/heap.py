"""Keep freed memory in the process heap instead of handing it back to the kernel (glibc only): batches then reuse heap
blocks instead of page-faulting their activations in again (``docs/performance.md``, "The kernel's page faults"). A
process-wide setting that cannot be undone: ``bench eval`` makes it, the library (``genshift.evaluate``) never does;
DataLoader workers forked afterwards inherit it."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # <malloc.h>


def keep_freed_memory() -> bool:
    """Large blocks from the heap, never trimmed, one arena (call before threads allocate); True if glibc agreed."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30)) and bool(mallopt(M_ARENA_MAX, 1))
    log.debug("glibc mallopt: mmap off, trim threshold 1 GiB, one arena: %s", ok)
    return ok
