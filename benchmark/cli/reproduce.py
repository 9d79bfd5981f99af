"""`bench reproduce`: a paper's table from a population's results, the paper's numbers beside ours."""

from __future__ import annotations

from genshift.cli._common import add_verb, print_json, print_table
from genshift.eval.reproduce import TABLES, reproduce, result_files  # light: yaml and the population registry


def _member(text: str) -> tuple[str, str]:
    import argparse

    paper, sep, mid = text.partition("=")
    if not sep or not paper or not mid:
        raise argparse.ArgumentTypeError(f"expected PAPER_NAME=MODEL_ID (e.g. RN2=resnet50@sha256:<16 hex>), got "
                                         f"{text!r}")
    return paper, mid


def add_parser(sub):
    p = add_verb(sub, "reproduce", help="print a paper's table from results, with the paper's numbers beside ours",
                 description="Print a paper's table from its population's results: ours, the paper's (with its source) "
                             "and the difference per cell; a member's row is filled only by a result of its weights. "
                             "Lists the members without a result and what makes a number disagree "
                             "(docs/reproducing.md). Runs no model.",
                 examples="  bench reproduce lance-table2 runs/lance-hardimagenet/\n"
                          "  bench reproduce in-g-fig4 runs/in-g-rn/ runs/in-g-vit/ "
                          "--member RN2=resnet50@sha256:<16 hex>\n"
                          "  bench reproduce imagenet-star-slopes runs/imagenet-star-upstream/ --json\n"
                          "  bench reproduce imagenet-star-slopes runs/imagenet-star-upstream/ --id-accuracy "
                          "results-imagenet.csv\n")
    p.add_argument("table", choices=TABLES, help="the paper table: " + ", ".join(TABLES))
    p.add_argument("results", nargs="+", help="result.json files or folders searched for them (e.g. runs/<suite>/)")
    p.add_argument("--member", type=_member, action="append", metavar="PAPER_NAME=MODEL_ID",
                   help="the local weights (their results' model id) of a member without public weights, e.g. "
                        "RN2=resnet50@sha256:<16 hex>; repeatable")
    p.add_argument("--id-accuracy", metavar="CSV",
                   help="imagenet-star-slopes: ImageNet-val top-1 on the x-axis (timm's results-imagenet.csv: "
                        "model,img_size,top1) instead of base, each result at its eval's input size")
    p.add_argument("--json", action="store_true", help="print the whole report (every cell with its source) as JSON")
    return p


def run(args) -> int:
    from genshift.eval.results import load_result
    from genshift.eval.slope import read_id_table

    id_table = read_id_table(args.id_accuracy) if args.id_accuracy else None
    results = [(str(p), load_result(p)) for p in result_files(args.results)]
    report = reproduce(args.table, results, members=dict(args.member or []), id_table=id_table)
    if args.json:
        print_json(report)
        return 0
    print(f"{report['title']}\npaper: {report['paper']}, {report['where']}; population {report['population']} "
          f"on {report['suite']}\n")
    print_table(report["layout"]["rows"], report["layout"]["columns"])
    for title, lines in (("rows filled by", [f"{f['row']}: {f['weights']} ({f['result']})" for f in report["filled"]]),
                         ("not reproduced", [f"{k}: {v}" for k, v in report["not_reproduced"].items()]),
                         ("missing (run these, then reproduce again)", report["missing"]),
                         ("results outside the population (ignored)", report["outside_population"]),
                         ("notes (what makes a number disagree)", report["notes"])):
        if lines:
            print(f"\n{title}:", *(f"  {line}" for line in lines), sep="\n")
    return 0
