"""`bench eval`: score a timm model on a suite (per-image predictions, metrics with CIs, provenance)."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import signal
import sys

from genshift.cli._common import add_mask_options, add_verb, csv_list, mask_arg, percent, print_json, print_table
from genshift.cli.build import add_config, flag
from genshift.errors import BenchError
from genshift.eval.options import EvalOptions, OptionError, resolve_models
from genshift.families import get_family

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # <malloc.h>


def add_parser(sub):
    p = add_verb(
        sub, "eval", help="score a timm model on a suite",
        description="Score timm ImageNet-1k classifiers on a suite: per-image predictions, the suite family's "
                    "metrics with bootstrap intervals and a result JSON with provenance. Several models share each "
                    "image decode; under torchrun or `accelerate launch` the work is split over processes. A killed "
                    "run resumes; a finished one is a no-op unless --force. The same as genshift.evaluate().",
        examples=(
            "  bench eval --model timm/resnet50.a1_in1k --suite imagenet-star-upstream --configs base,in_the_snow\n"
            "  bench eval --model resnet50.a1_in1k --suite ./my-suite --device cuda --amp --batch-size 256\n"
            "  bench eval --model tf_efficientnet_lite0 --checkpoint lite0.pth --remap-by-order "
            "--suite ./photos-suite\n"
            "  HF_HUB_OFFLINE=1 bench eval --model hf-hub:timm/resnet50.a1_in1k@<sha> --suite lance-hardimagenet\n"
            "  bench eval --model 'timm/convnext_*.fb_in1k' --model resnet50.a1_in1k --suite imagenet-star\n"
            "  bench eval --models zoo.txt --suite ./my-suite --max-resident 8\n"
            "  bench eval --models lance-table2 --suite lance-hardimagenet --preprocess lance-square\n"
            "  accelerate launch -m genshift eval --models zoo.txt --suite imagenet-star --device cuda --amp\n"
            "  torchrun --nproc_per_node 4 -m genshift eval --models zoo.txt --suite ./my-suite --cpu-threads 1\n"
            "  bench eval --merge runs/\n"))
    p.add_argument("--model", action="append", metavar="MODEL",
                   help="timm name, timm/<name>, hf-hub:<repo>[@sha], a timm wildcard ('timm/convnext_*.fb_in1k', "
                        "1000-class heads only) or NAME=CHECKPOINT; repeat for a sweep")
    p.add_argument("--models", metavar="FILE|POPULATION",
                   help="a file of one model per line (optionally + a checkpoint path relative to the file; # "
                        "comments), or a paper's population by name (`bench suites`), e.g. lance-table2")
    p.add_argument("--population-config", choices=("paper", "today"), default="paper",
                   help="--models POPULATION: each model at the data config the paper's timm resolved (paper, "
                        "recorded in the population) or at today's timm config (today); recorded in the result")
    p.add_argument("--suite", help="registry id (see `bench suites`), Hub repo id, or a suite folder")
    p.add_argument("--configs", type=csv_list, help="comma-separated configs (default: all)")
    p.add_argument("--checkpoint", help="local weights of the one --model: safetensors, a PyTorch state dict or a "
                                        "timm training checkpoint")
    add_mask_options(p)
    add_config(p, EvalOptions, int_type=_int)  # every option of genshift.evaluate: its field's help, bounds, choices
    p.add_argument("--merge", metavar="OUT",
                   help="build the results of a (distributed) sweep in OUT from its checked units (names missing ones)")
    p.add_argument("--out", default="runs", help="output directory")
    p.add_argument("--json", action="store_true", help="print the result JSON instead of the summary table")
    return p


def _int(text: str):
    """An integer option ('1e3' too); anything else is left for ``EvalOptions`` to refuse by flag."""
    try:
        return int(text)
    except ValueError:
        try:
            v = float(text)
        except ValueError:
            return text  # reported by EvalOptions
        return int(v) if v.is_integer() and abs(v) < 1e300 else text


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: checkpoints are flushed on the way out."""


def _on_sigterm(signum, frame):
    raise Terminated()


def keep_freed_memory() -> bool:
    """Keep freed memory in the process heap (glibc): large blocks from the heap, never trimmed, one arena, so
    batches reuse heap blocks instead of page-faulting their activations in again (``docs/performance.md``, "Page
    faults"). Process-wide and final: ``bench eval`` sets it before threads allocate, the library never does; True
    if glibc agreed."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to tune
        return False
    ok = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30)) and bool(mallopt(M_ARENA_MAX, 1))
    log.debug("glibc mallopt: mmap off, trim threshold 1 GiB, one arena: %s", ok)
    return ok


def run(args) -> int:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EvalOptions) if hasattr(args, f.name)}
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        opts = EvalOptions(**{**given, "mask": mask_arg(args)})  # every option checked before anything is read
        keep_freed_memory()  # before any tensor or DataLoader worker: batches reuse heap blocks
        return _run(args, opts)
    except OptionError as e:  # the option's name replaced by its flag
        text = str(e)
        if text.startswith(e.option):
            text = flag(e.option, EvalOptions) + text[len(e.option):]
        raise BenchError(text) from None
    except Terminated:
        print("terminated; finished units are flushed and a rerun resumes", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args, opts) -> int:
    from genshift.eval.merging import merge
    from genshift.eval.sweep import SweepRequest, run_sweep

    if args.merge:
        if args.model or args.models:
            raise BenchError("--merge OUT builds results from a sweep's units; give it without --model/--models")
        for path, result in merge(args.merge):
            print(f"{result['model']['id']}: {path}")
        return 0
    specs, expansions = resolve_models(args.model, models_file=args.models, checkpoint=args.checkpoint,
                                       population_config=args.population_config)
    for pattern, names in expansions.items():
        print(f"{pattern} -> {len(names)} model(s): {', '.join(names)}", file=sys.stderr)
    if not args.suite:
        raise BenchError("--suite is required: a registry id (see `bench suites`), a Hub repo id or a suite folder")
    req = SweepRequest(models=tuple(specs), suite=args.suite, configs=tuple(args.configs) if args.configs else None,
                       out=args.out, options=opts, wildcards=expansions)
    jobs = run_sweep(req)
    if len(jobs) == 1 and jobs[0].result is not None:
        if args.json:
            print_json(jobs[0].result)
        else:
            print_summary(jobs[0].result)
            print(f"\nresult: {jobs[0].run_dir / 'result.json'}")
        return 0
    if args.json:
        print_json([{"model": j.model_id, "status": j.status, "error": j.error,
                     "result": str(j.run_dir / "result.json") if j.result else None} for j in jobs])
    else:
        print_sweep(jobs)
    return 1 if any(j.status == "failed" for j in jobs) else 0


def print_sweep(jobs) -> None:
    """One row per model: the family's headline and mean acc@1 (``genshift.families``), result or error."""
    done = [j.result for j in jobs if j.result]
    family = get_family(done[0]["suite"]["metric_family"] if done else "accuracy")
    shown = list(dict.fromkeys((family.headline, "mean_acc1")))
    labels = {k: f"{family.metric(k).label} {family.metric(k).unit}" for k in shown}
    rows = []
    for j in jobs:
        row = {"model": j.model_id, "status": j.status}
        if j.result:
            cols = family.columns(j.result)
            row.update({labels[k]: "-" if cols[k] != cols[k] else f"{100 * cols[k]:.2f}" for k in shown})
            row["result / error"] = str(j.run_dir / "result.json")
        else:
            row["result / error"] = j.error or "units done here; built by the last process (or --merge)"
        rows.append(row)
    print_table(rows, ["model", "status", *labels.values(), "result / error"])
    failed = [j for j in jobs if j.status == "failed"]
    if failed:
        print(f"\n{len(failed)} model(s) failed: " + ", ".join(j.model_id for j in failed)
              + "; the others' results are complete, a rerun retries the failed ones")


def print_summary(result: dict) -> None:
    """acc@1 [CI] and acc@5 per config, then the family's other numbers with their labels and units."""
    family = get_family(result["suite"]["metric_family"])
    cols = family.columns(result)
    rows = [{"config": c, "scored": m["n_scored"], "acc@1 % [95% CI]": percent(m["acc1"]),
             "acc@5 %": percent(m["acc5"])} for c, m in result["metrics"]["configs"].items()]
    print(f"{result['model']['id']} on {result['suite']['id']}"
          f" (manifest {result['suite']['manifest_sha256'][:12]}, config hash {result['config_hash'][:12]})")
    print_table(rows, ["config", "scored", "acc@1 % [95% CI]", "acc@5 %"])
    for metric in (m for m in family.metrics if m.key not in ("acc1", "acc5")):
        mine = [k for k in cols if k == metric.key or k.startswith(metric.key + "/")]
        for col in sorted(k for k in mine if not k.endswith(("_lo", "_hi"))):
            ci = [cols.get(f"{col}_lo"), cols.get(f"{col}_hi")]
            shown = percent({"value": cols[col], "ci": ci if None not in ci else None})
            where = f" ({col.split('/', 1)[1]})" if "/" in col else ""
            print(f"{metric.label}{where}: {shown} {metric.unit}")
    flags = [k for k, v in result["flags"].items() if v]
    if flags:
        print("flags: " + ", ".join(flags))
