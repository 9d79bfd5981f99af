"""`bench reproduce`: a paper's table from a population's results, the paper's numbers beside ours."""

from __future__ import annotations

from genshift.cli._common import add_verb, print_json, print_table

from genshift.eval.reproduce import TABLES  # light: yaml and the population registry


def add_parser(sub):
    p = add_verb(sub, "reproduce", help="print a paper's table from results, with the paper's numbers beside ours",
                 description="Read the results of a paper's model population (bench eval --models <population>) and "
                             "print the paper's table in its layout: our number, the paper's reported number and the "
                             "difference per cell, each reported number with its source (paper, table, row). Lists "
                             "the population's models that have no result yet (with the command that scores each) "
                             "and the settings that make a number disagree. Runs no model.",
                 examples="  bench reproduce lance-table2 runs/lance-hardimagenet/\n"
                          "  bench reproduce in-g-fig4 runs/in-g-rn/ runs/in-g-vit/\n"
                          "  bench reproduce imagenet-star-slopes runs/imagenet-star-upstream/ --json\n")
    p.add_argument("table", choices=TABLES, help="the paper table: " + ", ".join(TABLES))
    p.add_argument("results", nargs="+", help="result.json files or folders searched for them (e.g. runs/<suite>/)")
    p.add_argument("--json", action="store_true", help="print the whole report (every cell with its source) as JSON")
    return p


def run(args) -> int:
    from genshift.eval.reproduce import reproduce, result_files
    from genshift.eval.results import load_result

    results = [(str(p), load_result(p)) for p in result_files(args.results)]
    report = reproduce(args.table, results)
    if args.json:
        print_json(report)
        return 0
    print(f"{report['title']}\npaper: {report['paper']}, {report['where']}; population {report['population']} "
          f"on {report['suite']}\n")
    print_table(report["layout"]["rows"], report["layout"]["columns"])
    for title, lines in (("not reproduced", [f"{k}: {v}" for k, v in report["not_reproduced"].items()]),
                         ("missing (run these, then reproduce again)", report["missing"]),
                         ("results outside the population (ignored)", report["outside_population"]),
                         ("notes (what makes a number disagree)", report["notes"])):
        if lines:
            print(f"\n{title}:")
            for line in lines:
                print(f"  {line}")
    return 0
