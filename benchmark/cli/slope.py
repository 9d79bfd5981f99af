"""`bench slope`: per shift across several models' results, the ID/OOD slope and the shift's impact."""

from __future__ import annotations

import sys

from genshift.cli._common import add_verb, percent, print_json, print_table


def add_parser(sub):
    p = add_verb(sub, "slope", help="ID/OOD slope, effective robustness and shift impact per shift across results",
                 description="Fit, per shift, the models' shift accuracy against their in-distribution accuracy on "
                             "linear and probit scales (slope, intercept, R^2, effective robustness); for ImageNet* "
                             "also the shift impact averaged over the models, with a 95% Student-t interval.",
                 examples="  bench slope runs/imagenet-star/*/result.json\n"
                          "  bench slope runs/imagenet-star/*/result.json --scale probit --json\n"
                          "  bench slope runs/imagenet-star-upstream/*/result.json "
                          "--id-accuracy results-imagenet.csv\n")
    p.add_argument("results", nargs="+", help="result.json files (or run folders)")
    p.add_argument("--reference", help="in-distribution config (default: the suite's, e.g. base)")
    p.add_argument("--id-accuracy", metavar="CSV",
                   help="timm's results-imagenet.csv (or any CSV of model,[img_size,]top1 in percent) as the ID axis "
                        "instead: each result takes its model's row at the input size its eval ran at")
    p.add_argument("--scale", choices=("linear", "probit", "both"), default="both",
                   help="accuracy scale of the fit: linear, probit or both")
    p.add_argument("--json", action="store_true", help="print the full table as JSON (fits, robustness, impact)")
    return p


def _num(v: float, fmt: str = ".3f") -> str:
    return "-" if v is None or v != v else format(v, fmt)


def run(args) -> int:
    from genshift.eval.results import load_result
    from genshift.eval.slope import SCALES, id_accuracy, read_id_table, slope_table
    from genshift.eval.verify import result_path

    id_table = read_id_table(args.id_accuracy) if args.id_accuracy else None  # options before the results
    results = [load_result(result_path(p)) for p in args.results]
    scales = SCALES if args.scale == "both" else (args.scale,)
    ids, sizes = id_accuracy(results, id_table) if id_table is not None else (None, None)
    table = slope_table(results, reference_config=args.reference, id_accuracy=ids, scales=scales)
    if ids is not None:
        table["id_axis"] = f"ImageNet-val top-1 from {args.id_accuracy} at each eval's input size"
        table["id_rows"] = {m: {"top1": ids[m], "img_size": sizes[m]} for m in ids}
    if args.json:
        print_json(table)
        return 0
    rows = []
    impact = table.get("shift_impact")
    for shift, fits in table["shifts"].items():
        row = {"shift": shift}
        for scale in scales:
            f = fits[scale]
            row.update({f"{scale} slope": _num(f["slope"]), f"{scale} intercept": _num(f["intercept"]),
                        f"{scale} R^2": _num(f["r2"])})
        if impact is not None:
            row["shift impact pp [95% CI over models]"] = percent(impact.get(shift))
        rows.append(row)
    print(f"ID axis: {table['id_axis']}; {len(table['models'])} models")
    print_table(rows, list(rows[0]) if rows else ["shift"])
    scale = scales[0]

    def robustness(model: str, fit: dict) -> str:
        """The model's accuracy above (+) or below the line, in points; '-' when it has no score on the shift."""
        if model not in fit["models"]:
            return "-"
        return _num(100 * fit["effective_robustness"][fit["models"].index(model)], "+.2f")

    print(f"\neffective robustness ({scale} fit), pp:")
    print_table([{"model": m, **{s: robustness(m, fits[scale]) for s, fits in table["shifts"].items()}}
                 for m in table["models"]], ["model", *table["shifts"]])
    for w in table["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    return 0
