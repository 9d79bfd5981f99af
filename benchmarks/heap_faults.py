"""glibc page faults of CPU batches with and without ``genshift.cli.eval_cmd.keep_freed_memory`` (``mallopt``).

A batch's widest activations are larger than glibc's mmap threshold, so without the setting every
batch maps them afresh and the kernel zeroes the pages again. This counts the minor page faults of
ten such "batches" after a warm-up, on one thread and on two (forward threads), each arm in a fresh
process. It measures, it asserts nothing: a loaded machine changes the counts.

    python benchmarks/heap_faults.py
"""

import json
import subprocess
import sys

PROBE = r"""
import resource, sys, threading, torch
from genshift.cli.eval_cmd import keep_freed_memory
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




def faults(mode: str, threads: int) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(threads)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[1])


if __name__ == "__main__":
    for threads in (1, 2):
        print(json.dumps({"threads": threads, "minor_faults_plain": faults("plain", threads),
                          "minor_faults_kept": faults("keep", threads)}))
