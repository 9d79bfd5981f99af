"""`bench eval`: score a timm model on a suite (per-image predictions, metrics with CIs, provenance)."""

from __future__ import annotations

from benchmark.cli._common import add_verb, csv_list, positive_int, print_json, print_table


def add_parser(sub):
    p = add_verb(
        sub, "eval", help="score a timm model on a suite",
        description="Score any timm ImageNet-1k classifier on a suite: per-image predictions (parquet), the "
                    "suite family's metrics with bootstrap intervals, and a result JSON with full provenance. "
                    "A killed run resumes; a finished run is a no-op unless --force.",
        examples=(
            "  bench eval --model timm/resnet50.a1_in1k --suite imagenet-star-upstream --configs base,in_the_snow\n"
            "  bench eval --model resnet50.a1_in1k --suite ./my-suite --device cuda --amp --batch-size 256\n"
            "  bench eval --model tf_efficientnet_lite0 --checkpoint lite0.pth --remap-by-order --suite ./photos-suite\n"
            "  HF_HUB_OFFLINE=1 bench eval --model hf-hub:timm/resnet50.a1_in1k@<sha> --suite lance-hardimagenet\n"
        ))
    p.add_argument("--model", required=True, help="timm name, timm/<name> or hf-hub:<repo>[@sha]")
    p.add_argument("--suite", required=True, help="registry id (see `bench suites`), Hub repo id, or a suite folder")
    p.add_argument("--configs", type=csv_list, help="comma-separated configs (default: all)")
    p.add_argument("--revision", help="suite commit sha (overrides the registry's pin)")
    p.add_argument("--checkpoint", help="local weights: safetensors, a PyTorch state dict or a timm training checkpoint")
    p.add_argument("--checkpoint-weights", choices=("model", "ema"), default="model",
                   help="which weights of a timm training checkpoint: model (default, as timm's validate.py) or ema")
    p.add_argument("--remap-by-order", action="store_true",
                   help="map checkpoint tensors onto the model by position when key names differ")
    p.add_argument("--mask", help="imagenet-star-upstream only: the authors' masks.npy")
    p.add_argument("--limit-per-class", type=positive_int, help="score only the first N images of each class")
    p.add_argument("--batch-size", type=positive_int, help="default: 8 on CPU (fastest there), 256 on CUDA")
    p.add_argument("--workers", type=int, help="DataLoader decode workers (default: min(4, cpus-1))")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--amp", action="store_true", help="autocast on CUDA")
    p.add_argument("--amp-dtype", choices=("bfloat16", "float16"), default="bfloat16",
                   help="autocast dtype with --amp (default: bfloat16)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="torch.compile the model (auto: only when the run is long enough to pay it back)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false",
                   help="keep the default memory format (channels-last is usually faster)")
    p.add_argument("--topk", type=positive_int, default=10, help="predictions stored per image (>= 5)")
    p.add_argument("--no-filter", dest="filter", action="store_false", help="score filtered (keep=false) rows too")
    p.add_argument("--reference-accuracy", type=float,
                   help="ImageNet*: absolute impact against this in-distribution accuracy (0..1) instead of base")
    p.add_argument("--bootstrap", type=positive_int, default=1000, help="bootstrap replicates for the intervals")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--skip-bad-images", action="store_true", help="skip and count images that do not decode")
    p.add_argument("--out", default="runs", help="output directory (default: runs/)")
    p.add_argument("--force", action="store_true", help="re-run even if a finished result exists")
    p.add_argument("--notes", default="", help="free text stored in the result")
    p.add_argument("--json", action="store_true", help="print the result JSON instead of the summary table")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return p


def run(args) -> int:
    from benchmark.errors import BenchError
    from eval.inference import InferenceOptions
    from eval.runner import EvalRequest, evaluate
    from eval.scoring import ScoringOptions

    if args.topk < 5:
        raise BenchError(f"--topk must be at least 5 (acc@5 needs it), got {args.topk}")
    if args.reference_accuracy is not None and not 0 <= args.reference_accuracy <= 1:
        raise BenchError(f"--reference-accuracy is a fraction in [0, 1], got {args.reference_accuracy}")
    if args.workers is not None and args.workers < 0:
        raise BenchError(f"--workers must be >= 0, got {args.workers}")
    req = EvalRequest(
        model=args.model, suite=args.suite, configs=tuple(args.configs) if args.configs else None,
        revision=args.revision, checkpoint=args.checkpoint, remap_by_order=args.remap_by_order,
        checkpoint_weights=args.checkpoint_weights, mask=args.mask,
        out=args.out, force=args.force, notes=args.notes,
        inference=InferenceOptions(
            batch_size=args.batch_size, workers=args.workers, device=args.device, amp=args.amp,
            amp_dtype=args.amp_dtype, channels_last=args.channels_last, compile=args.compile, topk=args.topk,
            limit_per_class=args.limit_per_class, skip_bad_images=args.skip_bad_images),
        scoring=ScoringOptions(filter=args.filter, reference_accuracy=args.reference_accuracy,
                               n_boot=args.bootstrap, seed=args.seed),
    )
    result, path = evaluate(req, progress=args.progress)
    if args.json:
        print_json(result)
    else:
        print_summary(result)
        print(f"\nresult: {path}")
    return 0


def _fmt(m: dict | None, *, pp: bool = True) -> str:
    if not m or m.get("value") is None:
        return "-"
    scale = 100 if pp else 1
    text = f"{m['value'] * scale:.2f}"
    if m.get("ci"):
        text += f" [{m['ci'][0] * scale:.2f}, {m['ci'][1] * scale:.2f}]"
    return text


def print_summary(result: dict) -> None:
    """The end-of-run table: per config accuracy, plus the family's headline metrics (in %)."""
    mets = result["metrics"]
    star = mets.get("imagenet_star", {}).get("absolute_impact", {})
    in_g = mets.get("in_g", {})
    rows = []
    for cfg, m in mets["configs"].items():
        row = {"config": cfg, "scored": m["n_scored"], "acc@1 % [95% CI]": _fmt(m["acc1"]), "acc@5 %": _fmt(m["acc5"])}
        if star:
            row["impact pp"] = _fmt(star.get(cfg))
        if cfg in in_g:
            row["top3 fail %"] = _fmt(in_g[cfg]["top3_failure_rate"])
            row["parent fail %"] = _fmt(in_g[cfg]["parent_failure_rate"])
        rows.append(row)
    cols = list(rows[0]) if rows else ["config"]
    print(f"{result['model']['id']} on {result['suite']['id']}"
          f" (manifest {result['suite']['manifest_sha256'][:12]}, config hash {result['config_hash'][:12]})")
    print_table(rows, cols)
    if "imagenet_star" in mets:
        print(f"mean absolute impact: {_fmt(mets['imagenet_star'].get('mean_absolute_impact'))} pp "
              f"(reference: {mets['imagenet_star'].get('reference')})")
    if "lance" in mets and "delta_acc1" in mets["lance"]:
        lance = mets["lance"]
        t = lance["headline_T"]
        print(f"LANCE Δacc@1 {_fmt(lance['delta_acc1'][t])} pp, Δacc@5 {_fmt(lance['delta_acc5'][t])} pp "
              f"(T = {t}); mean Δp {_fmt(lance['delta_p'])} pp over {lance['n_pairs']} pairs")
    flags = [k for k, v in result["flags"].items() if v]
    if flags:
        print("flags: " + ", ".join(flags))
