"""`bench slope`: per shift across several models' results, the ID/OOD slope and the shift's impact."""

from __future__ import annotations

from benchmark.cli._common import add_verb, print_json, print_table


def add_parser(sub):
    p = add_verb(sub, "slope", help="ID/OOD slope, effective robustness and shift impact per shift across results",
                 description="Fit, per shift, each model's shift accuracy against its in-distribution accuracy "
                             "(ImageNet* base by default), on linear and probit scales: slope, intercept, R^2 and "
                             "each model's effective robustness (its residual, in accuracy units). For ImageNet* "
                             "results also the shift impact (Dataset Interfaces' absolute impact of a shift): the "
                             "drop acc(reference) - acc(shift) averaged over the models, with a 95% Student-t "
                             "interval over models. (A result's model_mean_impact is another quantity: one model's "
                             "drop averaged over shifts.)",
                 examples="  bench slope runs/imagenet-star/*/result.json\n"
                          "  bench slope runs/imagenet-star/*/result.json --scale probit --json\n"
                          "  bench slope r1.json r2.json r3.json --id-accuracy timm_val_top1.csv\n")
    p.add_argument("results", nargs="+", help="result.json files (or run folders)")
    p.add_argument("--reference", help="in-distribution config (default: the suite's, e.g. base)")
    p.add_argument("--id-accuracy", help="CSV of model,top1 (fraction or percent) to use as the ID axis instead")
    p.add_argument("--scale", choices=("linear", "probit", "both"), default="both",
                   help="accuracy scale of the fit: linear, probit or both (default: both)")
    p.add_argument("--json", action="store_true", help="print the full table as JSON (fits, effective robustness, "
                                                       "shift_impact)")
    return p


def _read_id_csv(path: str) -> dict[str, float]:
    import csv
    import io

    from benchmark.errors import BenchError
    from benchmark.fsutil import read_text_limited
    from leaderboard.aggregate import MAX_ID_ACCURACY_BYTES  # the same file as `bench leaderboard --id-accuracy`

    out = {}
    text = read_text_limited(path, max_bytes=MAX_ID_ACCURACY_BYTES, what="--id-accuracy CSV")
    try:
        for row in csv.DictReader(io.StringIO(text, newline="")):
            v = float(str(row["top1"]).replace(",", ""))
            out[row["model"]] = v / 100 if v > 1 else v
    except (KeyError, ValueError) as e:
        raise BenchError(f"--id-accuracy {path!r}: expected a CSV with columns model,top1 ({type(e).__name__}: {e})") from None
    return out


def _pp(m: dict | None) -> str:
    if not m or m.get("value") is None:
        return "-"
    text = f"{100 * m['value']:.2f}"
    return text + (f" [{100 * m['ci'][0]:.2f}, {100 * m['ci'][1]:.2f}]" if m.get("ci") else "")


def run(args) -> int:
    from eval.results import load_result
    from eval.slope import SCALES, slope_table
    from eval.verify import result_path

    ids = _read_id_csv(args.id_accuracy) if args.id_accuracy else None  # options before the results
    results = [load_result(result_path(p)) for p in args.results]
    scales = SCALES if args.scale == "both" else (args.scale,)
    table = slope_table(results, reference_config=args.reference, id_accuracy=ids, scales=scales)
    if args.json:
        print_json(table)
        return 0
    rows = []
    impact = table.get("shift_impact")
    for shift, fits in table["shifts"].items():
        row = {"shift": shift}
        for scale in scales:
            f = fits[scale]
            row[f"{scale} slope"] = "-" if f["slope"] != f["slope"] else f"{f['slope']:.3f}"
            row[f"{scale} R^2"] = "-" if f["r2"] != f["r2"] else f"{f['r2']:.3f}"
        if impact is not None:
            row["shift impact pp [95% CI over models]"] = _pp(impact.get(shift))
        rows.append(row)
    print(f"ID axis: {table['id_axis']}; {len(table['models'])} models")
    print_table(rows, list(rows[0]) if rows else ["shift"])
    return 0
