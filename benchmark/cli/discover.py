"""`bench discover`: find captions that make a model fail on a class (Wiles et al. s4.1)."""

from __future__ import annotations

from genshift.cli._common import add_verb, print_table


def add_parser(sub):
    from genshift.builders.discover import Config
    from genshift.cli.build import add_config

    p = add_verb(sub, "discover", help="open-ended failure search for one class",
                 description="Generate images of a class, caption the ones the model gets wrong, regenerate from "
                             "each caption and report which captions raise the failure (or target-class) rate, with "
                             "a one-sided Fisher exact test (Wiles et al. s4.1).",
                 examples="  bench discover --model resnet50.tv_in1k --class n01985128\n"
                          "  bench discover --model resnet50.tv_in1k --class 283 --target 287 --n-baseline 500\n")
    add_config(p, Config)
    return p


def run(args) -> int:
    from genshift.builders.discover import Config, search
    from genshift.cli.build import config_from, flagged
    from genshift.fsutil import atomic_write_json

    cfg = config_from(Config, args)
    report = flagged(Config, search, cfg)
    b, prompt = report["baseline"], report["class_prompt"]
    print(f"{prompt}  baseline {report['rate']}: {b['failures']}/{b['n']} = {100 * b['rate']:.2f}%")
    rows = [{"caption": h["caption"][len(prompt):].strip() or "(class prompt)",
             "failures": f"{h['failures']}/{h['n']}", "rate %": f"{100 * h['rate']:.1f}",
             "ratio": "-" if h["ratio"] is None else f"{h['ratio']:.2f}", "p": f"{h['p_value']:.2g}",
             "q (BH)": f"{h['q_value']:.2g}", "significant": "yes" if h["significant"] else ""}
            for h in report["hypotheses"] + report["refinement"]]
    if report["hypotheses"]:
        print_table(rows, list(rows[0]))
    else:
        print(report.get("note", "no hypotheses"))
    if cfg.out:
        atomic_write_json(cfg.out, report)
        print(f"report: {cfg.out}")
    return 0
