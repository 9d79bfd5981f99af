"""`bench suites`: list the registered suites and the papers' model populations."""

from __future__ import annotations

import dataclasses
import difflib

from genshift.cli._common import add_verb, print_json, print_table


def add_parser(sub):
    p = add_verb(sub, "suites", help="list the registered benchmark suites and model populations",
                 description="List the registered suites (Hub repo, pinned revision, configs, metric family) and "
                             "the papers' model populations (`bench eval --models <population>`).",
                 examples="  bench suites\n  bench suites 'in-g-*'\n  bench suites --json\n"
                          "  bench suites --populations\n")
    p.add_argument("pattern", nargs="?", default="*", help="shell wildcard over suite ids (default: all)")
    p.add_argument("--json", action="store_true", help="print the full specs as JSON")
    p.add_argument("--populations", action="store_true",
                   help="list every model of the populations (timm tag, the paper's name, role) and why each tag")
    return p


def run(args) -> int:
    from genshift.suites import get_population, get_suite, list_populations, list_suites

    if args.populations:  # every model of every population, and why each tag
        pops = [get_population(n) for n in list_populations()]
        if args.json:
            print_json([p.to_dict() for p in pops])
            return 0
        for p in pops:
            print(f"{p.name}: {p.title}\n  source: {p.source}\n  choice: {p.choice}")
            print_table([{"model": m.model + (" (your checkpoint)" if m.local else ""), "paper": m.paper,
                          "role": m.role} for m in p.members], ["model", "paper", "role"])
            print()
        return 0
    specs = [get_suite(s) for s in list_suites(args.pattern)]
    if args.json:
        print_json([dataclasses.asdict(s) for s in specs])
        return 0
    rows = [{"suite": s.id, "repo": s.repo_id, "revision": s.revision[:12] if s.revision else "unpinned",
             "configs": len(s.configs) if len(s.configs) > 3 else ",".join(s.configs), "metrics": s.metric_family,
             "labels": "all 1000" if s.label_subset is None else f"{len(s.label_subset)} classes", "title": s.title}
            for s in specs]
    if not rows:
        close = difflib.get_close_matches(args.pattern, list_suites(), n=1)
        print(f"no suite matches {args.pattern!r}" + (f"; did you mean {close[0]!r}?" if close else "")
              + "; run `bench suites` for the list")
        return 1
    print_table(rows, ["suite", "repo", "revision", "configs", "metrics", "labels", "title"])
    listed = {sp.id for sp in specs}  # the populations that score a listed suite
    pops = [p for p in (get_population(n) for n in list_populations()) if listed & set(p.suites)]
    if pops:
        print("\nmodel populations (bench eval --models <population>; bench suites --populations for the models):")
        print_table([{"population": p.name, "models": len(p.members), "suites": ",".join(p.suites), "title": p.title}
                     for p in pops], ["population", "models", "suites", "title"])
    return 0

