"""genshift.heap: a CPU batch's large blocks come back from the heap, not from the kernel each time."""

import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys, threading, torch
from genshift.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
threads = int(sys.argv[2])
# threads in lockstep: each round every thread's blocks are alive at once, so the warm-up reaches the
# heap's working size whatever the scheduling (a busy machine interleaves free threads differently)
together = threading.Barrier(threads)

def batches(n):
    for _ in range(n):  # a batch's widest activations, allocated, written and freed again and again
        t = torch.empty((16 if threads == 1 else 10) * 2**20)  # 64/40 MiB, over glibc's largest mmap threshold
        t.fill_(1.0)
        u = torch.empty(3 * 2**20)
        u.fill_(1.0)
        together.wait()
        del t, u
        together.wait()

def run(n):  # on the main thread, or on `threads` threads at once (forward threads, sweep lanes)
    if threads == 1:
        return batches(n)
    ts = [threading.Thread(target=batches, args=(n,)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()

run(12)  # warm-up: the heap grows to its working size (glibc reuses a freed block after a few)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
run(10)
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("threads", [1, 2])
def test_freed_blocks_are_reused_without_page_faults(threads):
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", PROBE, mode, str(threads)], capture_output=True, text=True,
                             check=True).stdout
        took, n = out.split()
        return took, int(n)

    _, plain = faults("plain")
    took, kept = faults("keep")
    assert took == "True"
    # each plain round maps 64 MiB afresh: ~16k faults of 4 KiB pages per round; kept: the heap's pages again
    assert plain > 10 * 10_000 and kept < plain / 20, (plain, kept)
