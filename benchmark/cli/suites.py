"""`bench suites`: list the registered suites."""

from __future__ import annotations

from benchmark.cli._common import add_verb, print_json, print_table


def add_parser(sub):
    p = add_verb(sub, "suites", help="list the registered benchmark suites",
                 description="List the registered suites: Hub repo, pinned revision, configs, metric family.",
                 examples="  bench suites\n  bench suites 'in-g-*'\n  bench suites --json\n")
    p.add_argument("pattern", nargs="?", default="*", help="shell wildcard over suite ids (default: all)")
    p.add_argument("--json", action="store_true", help="print the full specs as JSON")
    return p


def run(args) -> int:
    from benchmark.suites import get_suite, list_suites

    specs = [get_suite(s) for s in list_suites(args.pattern)]
    if args.json:
        print_json([s.to_dict() for s in specs])
        return 0
    rows = [{
        "suite": s.id,
        "repo": s.repo_id,
        "revision": s.revision[:12] if s.revision else "unpinned",
        "configs": len(s.configs) if len(s.configs) > 3 else ",".join(s.configs),
        "metrics": s.metric_family,
        "labels": "all 1000" if s.label_subset is None else f"{len(s.label_subset)} classes",
        "title": s.title,
    } for s in specs]
    if not rows:
        print(f"no suite matches {args.pattern!r}; run `bench suites` for the list")
        return 1
    print_table(rows, ["suite", "repo", "revision", "configs", "metrics", "labels", "title"])
    return 0
