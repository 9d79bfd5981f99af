"""`bench slope`: ID/OOD slope per shift across several models' results."""

from __future__ import annotations

from benchmark.cli._common import add_verb, print_json, print_table


def add_parser(sub):
    p = add_verb(sub, "slope", help="ID/OOD slope and effective robustness per shift across results",
                 description="Fit, per shift, each model's shift accuracy against its in-distribution accuracy "
                             "(ImageNet* base by default), on linear and probit scales: slope, intercept, R^2 and "
                             "each model's effective robustness (its residual, in accuracy units).",
                 examples="  bench slope runs/imagenet-star/*/result.json\n"
                          "  bench slope runs/imagenet-star/*/result.json --scale probit --json\n"
                          "  bench slope r1.json r2.json r3.json --id-accuracy timm_val_top1.csv\n")
    p.add_argument("results", nargs="+", help="result.json files (or run folders)")
    p.add_argument("--reference", help="in-distribution config (default: the suite's, e.g. base)")
    p.add_argument("--id-accuracy", help="CSV of model,top1 (fraction or percent) to use as the ID axis instead")
    p.add_argument("--scale", choices=("linear", "probit", "both"), default="both",
                   help="accuracy scale of the fit: linear, probit or both (default: both)")
    p.add_argument("--json", action="store_true", help="print the full table as JSON")
    return p


def _read_id_csv(path: str) -> dict[str, float]:
    import csv

    from benchmark.errors import BenchError

    out = {}
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                v = float(str(row["top1"]).replace(",", ""))
                out[row["model"]] = v / 100 if v > 1 else v
    except (OSError, KeyError, ValueError) as e:
        raise BenchError(f"--id-accuracy {path!r}: expected a CSV with columns model,top1 ({type(e).__name__}: {e})") from None
    return out


def run(args) -> int:
    from eval.results import load_result
    from eval.slope import SCALES, slope_table
    from eval.verify import result_path

    results = [load_result(result_path(p)) for p in args.results]
    scales = SCALES if args.scale == "both" else (args.scale,)
    ids = _read_id_csv(args.id_accuracy) if args.id_accuracy else None
    table = slope_table(results, reference_config=args.reference, id_accuracy=ids, scales=scales)
    if args.json:
        print_json(table)
        return 0
    rows = []
    for shift, fits in table["shifts"].items():
        row = {"shift": shift}
        for scale in scales:
            f = fits[scale]
            row[f"{scale} slope"] = "-" if f["slope"] != f["slope"] else f"{f['slope']:.3f}"
            row[f"{scale} R^2"] = "-" if f["r2"] != f["r2"] else f"{f['r2']:.3f}"
        rows.append(row)
    print(f"ID axis: {table['id_axis']}; {len(table['models'])} models")
    print_table(rows, list(rows[0]) if rows else ["shift"])
    return 0
