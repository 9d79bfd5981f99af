"""benchmark.heap: a CPU batch's large blocks come back from the heap, not from the kernel each time."""

import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys, torch
from benchmark.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
for _ in range(12):  # warm-up: the heap grows to its working size (glibc reuses a freed block after a few)
    torch.empty(16 * 2**20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # a batch's widest activation, allocated, written and freed again and again
    t = torch.empty(16 * 2**20)  # 64 MiB, over glibc's largest mmap threshold (32 MiB)
    t.fill_(1.0)
    del t
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults():
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
        took, n = out.split()
        return took, int(n)

    _, plain = faults("plain")
    took, kept = faults("keep")
    assert took == "True"
    # each plain round maps 64 MiB afresh: ~16k faults of 4 KiB pages per round; kept: the heap's pages again
    assert plain > 10 * 10_000 and kept < plain / 20, (plain, kept)
